"""Attribution in the agent: each physical GPU read once per sample, written on each worker using it with
that worker's own jobs; and read back per job and prefix, the job's own figures beside the device's.

Replays real NVML output through ``tests/fake_nvml.py``: the H100 shared by two
processes (``nvml_h100_shared.json``: 'matmul' holds 4682 MiB, 'holder' 12806 MiB),
and four GPUs under dask-cuda's rotated ``CUDA_VISIBLE_DEVICES`` lists. The
"workers" are what the agent keeps per worker (id, tags, visible devices,
activity, process tree), read by one :class:`HostCollector` over one
:class:`NvmlDevices` (NVML opened once for the host).
"""

import os
from collections import Counter

import pytest
from fake_nvml import FakeNvml

from dask_influx_metrics import query
from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.names import EVENT_TOPIC, SHARED_GPU
from dask_influx_metrics.sampling.collect import HostCollector
from dask_influx_metrics.sampling.sources.gpuprocs import Ancestry
from dask_influx_metrics.sampling.sources.nvml import NvmlDevices
from dask_influx_metrics.scheduler.plugin import JobPlugin
from dask_influx_metrics.schema import FIELDS, GPU

ALL = frozenset(k for k in FIELDS if k[0] == GPU)
DEVICE_WIDE = {"utilization_gpu", "memory_used", "power_draw", "clocks_event_reasons"}
MIB = 2**20


class Worker:
    """One worker as the agent sees it; ``run(job, dag)`` / ``idle()`` set what it executes."""

    def __init__(self, n: int, pid: int, visible=None):
        self.id, self.pid, self.visible, self.address = f"{n:03d}", pid, visible, f"tcp://w:{n}"
        self.tags = {"host": "node", "worker": self.address}
        self.snap = Snapshot((), 1, 0, 0)
        self.uuids = []

    def run(self, job, dag):
        self.snap = Snapshot((("task", job, dag),), 1, 0, job)

    def idle(self):
        self.snap = Snapshot((), 1, 0, self.snap.last_job)

    def snapshot(self):
        return self.snap

    def offset(self):
        return 0.0

    def read(self, snap=None):
        return {}


def fake_proc(tmp_path, parents: dict) -> str:
    """A ``/proc`` with a ``<pid>/stat`` per process, each naming its parent (``{pid: parent}``)."""
    for pid, parent in parents.items():
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "stat").write_text(f"{pid} (python3) S {parent} {pid} 0 0 -1\n")
    return str(tmp_path / "proc")


def h100(pid_of):
    """The H100 recording with its two processes' PIDs replaced: {recorded pid: pid}."""
    fake = FakeNvml("nvml_h100_shared.json")
    for procs in fake.devices[0]["compute_processes"]:
        for p in procs:
            p["pid"] = pid_of.get(p["pid"], p["pid"])
    return fake


def four_gpus():
    """The four-GPU recording, each GPU with no process on it (an empty compute-process list)."""
    fake = FakeNvml()
    for dev in fake.devices:
        dev["compute_processes"] = [[]]
    return fake


def rotated(i, n):
    """dask_cuda.utils.cuda_visible_devices(i, range(n))."""
    return ",".join(str((i + k) % n) for k in range(n))


def host(nvml, workers, fields=ALL):
    gpus = NvmlDevices(fields, devices="auto", nvml=nvml)
    for w in workers:
        w.uuids = gpus.resolve(w)
    return HostCollector(fields, gpus, host=None)


def test_two_workers_sharing_an_h100_each_get_its_readings_with_their_own_jobs():
    """Issue 33: a GPU's device-wide readings are written on each worker using it, tagged with that worker's
    own jobs and DAGs (never the union): each worker's table holds the GPU, a job only its own samples."""
    a, b = Worker(1, 1001), Worker(2, 1002)
    collector = host(h100({425: a.pid, 427: b.pid}), [a, b])
    a.run(1, 1)
    mine, theirs = collector.collect([a, b], now_ns=0)
    assert [p.tags["worker"] for p in (mine, theirs)] == [a.address, b.address]
    assert mine.tags["nvml_index"] == theirs.tags["nvml_index"] == "0" and mine.tags["uuid"] == theirs.tags["uuid"]
    assert (mine.tags["job"], mine.tags["dag"]) == ("1", "1") and (theirs.tags["job"], theirs.tags["dag"]) == ("0", "0")
    assert DEVICE_WIDE <= set(mine.fields) and {k: mine.fields[k] for k in DEVICE_WIDE} == {
        k: theirs.fields[k] for k in DEVICE_WIDE
    }, "one reading of the device, on both rows"
    assert mine.fields["worker_memory_used"] == 4909432832 / MIB
    assert theirs.fields["worker_memory_used"] == 13428064256 / MIB

    a.idle()
    b.run(2, 7)
    mine, theirs = collector.collect([a, b], now_ns=0)
    assert (mine.tags["job"], mine.tags["dag"]) == ("1", "0"), "job 1's worker is idle: never job 2's"
    assert (theirs.tags["job"], theirs.tags["dag"]) == ("2", "7") and DEVICE_WIDE <= set(theirs.fields)

    again = collector.collect([b], now_ns=0)  # the other left
    assert len(again) == 1 and again[0].tags["worker"] == b.address and DEVICE_WIDE <= set(again[0].fields)


def test_two_jobs_on_a_shared_gpu_are_never_joined_in_one_tag():
    a, b = Worker(1, 1001), Worker(2, 1002)
    collector = host(h100({425: a.pid, 427: b.pid}), [a, b])
    a.run(1, 3)
    b.run(2, 4)
    points = collector.collect([a, b], now_ns=0)
    assert [(p.tags["worker"], p.tags["job"], p.tags["dag"]) for p in points] == [
        (a.address, "1", "3"),
        (b.address, "2", "4"),
    ]
    assert all("utilization_gpu" in p.fields for p in points)
    assert list(collector.shared) == [points[0].tags["uuid"]]


def test_dask_cuda_rotated_lists_write_each_gpu_once():
    for n in (2, 4):
        workers = [Worker(i, 2000 + i, visible=rotated(i, 4)) for i in range(n)]
        collector = host(four_gpus(), workers)
        points = collector.collect(workers, now_ns=0)
        physical = FakeNvml().devices
        assert [w.uuids for w in workers] == [[physical[i]["uuid"]] for i in range(n)], "each reports its own GPU"
        assert all(p.tags["index"] == "0" for p in points)
        written = Counter(p.tags["uuid"] for p in points if "utilization_gpu" in p.fields or "memory_used" in p.fields)
        assert set(written.values()) == {1} and len(written) == n, f"a device series written twice: {written}"
        owners = {p.tags["uuid"]: p.tags["worker"] for p in points}
        assert owners == {w.uuids[0]: w.address for w in workers}


def test_plain_workers_seeing_every_gpu_read_each_once_and_write_it_on_each_worker():
    workers = [Worker(i, 3000 + i) for i in range(3)]
    nvml = four_gpus()
    collector = host(nvml, workers)
    for _ in range(3):
        points = collector.collect(workers, now_ns=0)
        rows = Counter(
            (p.tags["uuid"], p.tags["worker"]) for p in points if {"memory_used", "worker_memory_used"} <= set(p.fields)
        )
        assert len(rows) == 4 * 3 and set(rows.values()) == {1}, "each worker's row of each GPU it uses, once"
    alone, nvml_alone = Worker(9, 3009), four_gpus()
    one = host(nvml_alone, [alone])
    for _ in range(3):
        one.collect([alone], now_ns=0)
    for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage"):
        assert nvml.calls_to(call) == nvml_alone.calls_to(call) > 0, f"{call}: once per GPU and sample, not per worker"


def test_shared_gpu_report_names_every_worker_on_the_scheduler():
    plugin = JobPlugin({}, worker_payload=b"")
    plugin.log_event(
        EVENT_TOPIC,
        {
            "what": SHARED_GPU,
            "host": "node",
            "uuid": "GPU-da1f",
            "worker": "tcp://w:9",
            "workers": ["tcp://w:1", "tcp://w:2"],
        },
    )
    assert plugin.state()["shared_gpus"] == [
        {"host": "node", "uuid": "GPU-da1f", "workers": ["tcp://w:1", "tcp://w:2"]}
    ]


def test_per_worker_memory_left_out_in_a_container(monkeypatch):
    from dask_influx_metrics.sampling.sources import nvml as nvml_mod

    monkeypatch.setattr(nvml_mod, "host_pid_problem", lambda: "own PID namespace (test)")
    reports = []
    w = Worker(1, 1001)
    gpus = NvmlDevices(ALL, nvml=h100({}), report=lambda what, message, **d: reports.append(message))
    w.uuids = gpus.resolve(w)
    (reading,) = HostCollector(ALL, gpus, host=None).collect([w], now_ns=0)
    assert "worker_memory_used" not in reading.fields and "memory_used" in reading.fields
    assert reports == ["per-worker GPU memory left out: own PID namespace (test)"]


def test_shared_h100_time_goes_to_the_matmul_worker_and_per_job_shares_fit_the_device():
    """Issue 25's target on the replay: the worker running the matmul gets >= 95 % of the SM time, the
    one only holding memory <= 2 %, and the per-job shares sum to at most the device's utilization."""
    a, b = Worker(1, 425), Worker(2, 427)  # the recorded PIDs: 425 runs the matmul, 427 holds 12 GiB
    fields = ALL
    gpus = NvmlDevices(fields, nvml=FakeNvml("nvml_h100_shared.json"))
    for w in (a, b):
        w.uuids = gpus.resolve(w)
    gpus._devices[a.uuids[0]].procs._interval = 0.0  # a window every sample (1 s in production)
    collector = HostCollector(fields, gpus, host=None)
    a.run(1, 1)
    b.run(2, 2)
    seen = []
    for _ in range(4):
        points = collector.collect([a, b], now_ns=0)
        share = {
            p.tags["worker"]: p.fields["worker_utilization_gpu"] for p in points if "worker_utilization_gpu" in p.fields
        }
        device = [p.fields["utilization_gpu"] for p in points if "utilization_gpu" in p.fields]
        if share:
            seen.append(share)
            assert share[a.address] >= 95 and share[b.address] <= 2, share
            assert sum(share.values()) <= device[0] + 1e-9
            of_gpu = {p.tags["worker"]: p.fields["worker_gpu_share"] for p in points}
            assert of_gpu[a.address] >= 95 and of_gpu[b.address] <= 2 and sum(of_gpu.values()) <= 100 + 1e-9
    assert len(seen) >= 2, "the first answer (stale buffer) is left out, later windows are written"


def test_a_gpu_one_worker_shares_with_another_process_is_split_too(tmp_path):
    """Issue 25: one worker on the H100 beside a process of no worker (427, holding 12 GiB): the GPU is
    shared all the same, so the worker's share is read; the process is charged to nobody. A worker whose
    process tree holds every process on the GPU shares it with nobody: no ~2 ms per-process call."""
    a = Worker(1, 425)
    nvml = FakeNvml("nvml_h100_shared.json")
    gpus = NvmlDevices(ALL, nvml=nvml)
    a.uuids = gpus.resolve(a)
    gpus._devices[a.uuids[0]].procs._interval = 0.0  # a window every sample (1 s in production)
    a.run(1, 1)
    collector = HostCollector(ALL, gpus, host=None)
    shares = [p.fields.get("worker_utilization_gpu") for _ in range(3) for p in collector.collect([a], now_ns=0)]
    assert [s for s in shares if s is not None] and all(s >= 95 for s in shares if s is not None), shares

    tree = Worker(2, 425)
    nvml = FakeNvml("nvml_h100_shared.json")
    gpus = NvmlDevices(ALL, nvml=nvml)
    gpus._ancestry = Ancestry(proc=fake_proc(tmp_path, {427: 425}))  # 427 a child of the worker: its own tree
    tree.uuids = gpus.resolve(tree)
    collector = HostCollector(ALL, gpus, host=None)
    points = [p for _ in range(3) for p in collector.collect([tree], now_ns=0)]
    assert not any("worker_utilization_gpu" in p.fields for p in points)
    assert nvml.calls_to("nvmlDeviceGetProcessesUtilizationInfo") == 0


# The two recordings of a GPU shared by a bf16 matmul loop and a process only holding 12.5 GiB:
# (file, the matmul's pid, the holder's pid)
RECORDINGS = {
    "h100": ("nvml_h100_shared.json", 425, 427),
    "h200": ("nvml_h200_shared.json", 666, 668),
}


class Clock:
    """Simulated time for the agent's per-process reads (one window per ``gpu.process-interval``, 1 s)."""

    def __init__(self, wall: float):
        self.t, self.wall = 0.0, wall

    def __call__(self):
        return self.t


def replayed(recording, phase=None):
    """``(gpus, [matmul worker, holder worker], clock)`` on a replay of ``recording``: the workers under the
    recorded PIDs, the per-process reads paced by ``clock`` (advance ``clock.t``), its wall clock the
    recording's (just before its first per-process sample)."""
    name, matmul, holder = RECORDINGS[recording]
    fake = FakeNvml(name, phase=phase)
    gpus = NvmlDevices(ALL, nvml=fake)
    workers = [Worker(1, matmul), Worker(2, holder)]
    for w in workers:
        w.uuids = gpus.resolve(w)
    stamps = [
        s["timeStamp"] for a in fake.data["phases"]["shared"]["devices"][0]["processes_utilization_info"] for s in a
    ]
    clock = Clock(min(stamps) / 1e6 - 1)
    procs = gpus._devices[workers[0].uuids[0]].procs
    procs._clock, procs._wall = clock, lambda: clock.wall
    return fake, gpus, workers, clock


@pytest.mark.parametrize("recording", sorted(RECORDINGS))
def test_per_job_gpu_depth_from_the_replay_the_jobs_own_and_the_devices(tmp_path, recording):
    """Issue 33 item 2: per job, the device's utilization, SM active, occupancy and tensor activity
    (``device_``, both jobs ran on the GPU throughout) and each job's own: scaled by its worker's share of
    the GPU's kernel time, so the holder's job reads ~0 and the jobs' own figures sum to at most the
    device's. Sampled every 200 ms for 3 s (a per-process window a second), read back from a spool."""
    from dask_influx_metrics import lineprotocol, query
    from dask_influx_metrics.sinks.spool import SpoolSink

    _, gpus, (a, b), clock = replayed(recording)
    collector = HostCollector(ALL, gpus, host=None)
    a.run(1, 1)
    b.run(2, 2)
    sink = SpoolSink(tmp_path / "20260101T000000-000001" / "agent-node")
    t0 = 1_790_000_000_000_000_000
    for k in range(16):
        clock.t = k * 0.2
        sink.send(lineprotocol.encode_many(collector.collect([a, b], now_ns=t0 + k * 200_000_000)))
    sink.close()
    with query.connect(str(tmp_path)) as db:
        depth = query.gpu_during_tasks(db).set_index("job")
        notes = db.notes
    one, two = depth.loc[1], depth.loc[2]
    for f in ("utilization_gpu", "sm_active", "sm_occupancy", "pipe_tensor_active"):
        assert one[f"mean_device_{f}"] == two[f"mean_device_{f}"], f  # the union figure: one GPU, both jobs
    assert one["mean_device_utilization_gpu"] > 95 and round(one["mean_device_sm_active"]) == 96
    assert one["mean_worker_gpu_share"] >= 95 and two["mean_worker_gpu_share"] <= 2
    assert one["mean_sm_active"] >= 90 and two["mean_sm_active"] <= 5  # the matmul's job, the holder's
    assert two["mean_utilization_gpu"] <= 5 and two["mean_pipe_tensor_active"] <= 5
    assert round(one["mean_sm_occupancy"], 1) == round(one["mean_device_sm_occupancy"], 1) > 14
    for f in ("utilization_gpu", "sm_active", "sm_occupancy", "pipe_tensor_active", "dram_active"):
        assert one[f"mean_{f}"] + two[f"mean_{f}"] <= one[f"mean_device_{f}"] + 1e-9, f
    assert not notes, "every sample had a share point within 2.5 s"


@pytest.mark.parametrize("recording", sorted(RECORDINGS))
def test_per_prefix_gpu_depth_from_the_replay(tmp_path, recording):
    """Issue 33 item 2 per task prefix: the holder's task allocates its 12.5 GiB while the GPU idles (the
    recording's idle phase) and then holds it while the matmul runs (the shared phase); the matmul's tasks
    run the bf16 loop. Read back from a spool: the matmul prefix gets the recorded SM active and tensor
    activity as its own, the holder's own reads ~0 (its device figures keep what the GPU did meanwhile),
    and its memory delta is its allocation."""
    from dask_influx_metrics import lineprotocol, query
    from dask_influx_metrics.schema import Point
    from dask_influx_metrics.sinks.spool import SpoolSink

    fake, gpus, (a, b), clock = replayed(recording, phase="idle")
    collector = HostCollector(ALL, gpus, host=None)
    t0, step = 1_790_000_000_000_000_000, 200_000_000
    sink = SpoolSink(tmp_path / "20260101T000000-000001" / "agent-node")
    for k in range(11):
        clock.t = k * 0.2
        if k == 4:  # the holder's and then the matmul's process appear
            fake.devices = fake.data["phases"]["shared"]["devices"]
        for w, job, busy in ((b, 2, range(1, 7)), (a, 1, range(7, 11))):
            w.run(job, job) if k in busy else w.idle()
        sink.send(lineprotocol.encode_many(collector.collect([a, b], now_ns=t0 + k * step)))
    tasks = [
        (b, 2, "hold", 1, 6),  # windows 2-6: idle, idle, then three of the shared phase
        (a, 1, "matmul", 7, 10),  # windows 8-10: the bf16 loop
    ]
    sink.send(
        lineprotocol.encode_many(
            Point(
                "task",
                {**w.tags, "job": str(job), "dag": str(job), "prefix": prefix, "state": "memory"},
                {"key": prefix, "start": (t0 + start * step) / 1e9, "duration": (end - start) * step / 1e9},
                t0 + end * step,
            )
            for w, job, prefix, start, end in tasks
        )
    )
    sink.close()
    with query.connect(str(tmp_path)) as db:
        per = query.gpu_per_prefix(db).set_index("prefix")
    matmul, hold = per.loc["matmul"], per.loc["hold"]
    assert matmul["mean_sm_active"] >= 90 and round(matmul["mean_sm_active"]) == round(matmul["mean_device_sm_active"])
    assert matmul["mean_pipe_tensor_active"] >= 90 and matmul["mean_utilization_gpu"] > 95
    assert hold["mean_sm_active"] <= 5 and hold["mean_pipe_tensor_active"] <= 5 and hold["mean_utilization_gpu"] <= 5
    assert hold["mean_device_sm_active"] > 40, "three of its five windows saw the matmul on the device"
    assert hold["gpu_s"] == pytest.approx(1.0) and matmul["gpu_s"] == pytest.approx(0.6)
    assert hold["mean_memory_delta"] == 13428064256 / MIB and matmul["mean_memory_delta"] == 0


def test_a_workers_gpu_processes_come_from_their_proc_parents_not_a_scan_of_every_process(tmp_path, monkeypatch):
    """Issue 32: psutil's children() reads every /proc/<pid>/stat (1.5-2 ms with ~180 processes on the H200
    host). The agent follows the few PIDs NVML lists up their parents instead: 425 (the matmul) is a
    grandchild of worker 100 through 300; 427 (the holder) belongs to nobody. Each PID is read again at
    most once a second; no other process is looked at."""
    import psutil

    monkeypatch.setattr(psutil.Process, "children", lambda *a, **k: pytest.fail("a scan of every process"))
    proc = fake_proc(tmp_path, {425: 300, 300: 100, 100: 1, 427: 1})
    opened = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        if str(path).startswith(proc):
            opened.append(str(path).removeprefix(proc))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    clock = [0.0]
    w = Worker(1, 100)
    gpus = NvmlDevices(ALL, nvml=h100({}))
    gpus._ancestry = Ancestry(clock=lambda: clock[0], proc=proc)
    w.uuids = gpus.resolve(w)
    collector = HostCollector(ALL, gpus, host=None)
    for _ in range(10):  # ten samples within a second
        (point,) = collector.collect([w], now_ns=0)
        assert point.fields["worker_memory_used"] == 4909432832 / MIB, "the matmul's memory, not the holder's"
    assert sorted(opened) == ["/300/stat", "/425/stat", "/427/stat"], "each listed PID's parents, read once"
    clock[0] = 1.0
    collector.collect([w], now_ns=0)
    assert len(opened) == 6, "and again after a second"


def test_every_per_gpu_call_once_per_sample_however_many_workers_share_it():
    """Issue 32: what NVML burns per sample (cost mode, the H200's prices) is the same for 1 and 4 workers on
    one GPU, but for the per-process utilization read on a shared GPU (at most once a second)."""

    def burned(n):
        nvml = FakeNvml("nvml_h200_shared.json", phase="idle", cost="idle")
        workers = [Worker(i, 4000 + i) for i in range(n)]
        collector = host(nvml, workers)
        collector.collect(workers, now_ns=0)  # the first sample reads the counters
        nvml.charged.clear()
        for _ in range(10):  # well within a second
            collector.collect(workers, now_ns=0)
        return dict(nvml.charged)

    one, four = burned(1), burned(4)
    per_process = four.pop("nvmlDeviceGetProcessesUtilizationInfo", 0)
    assert per_process <= 1 and "nvmlDeviceGetProcessesUtilizationInfo" not in one, "~2 ms: shared GPUs, <= 1/s"
    assert one == four and one["nvmlDeviceGetComputeRunningProcesses"] == one["nvmlDeviceGetMemoryInfo"] == 10


def _hold(seconds):
    import threading

    threading.Event().wait(seconds)


def _set_env(values):
    import os

    os.environ.update(values)


def test_two_workers_sharing_the_replayed_h200_end_to_end(tmp_path, monkeypatch, influxd, fresh_db):
    """Issue 33's targets on a real LocalCluster of 2 worker processes whose agent replays the H200
    recording: worker 0 (standing for the recording's holder, pid 668) runs job 1, worker 1 (the bf16
    matmul, pid 666) runs job 2, at the same time, on the one GPU both see. Read back from the spool and
    from InfluxDB (InfluxQL): each worker's own table and peaks hold its own jobs only, the holder's job and
    prefix read ~0 of the GPU's SM time and the matmul's >= 90 %, and the summary counts the GPU once."""
    from distributed import Client, LocalCluster
    from nvml_shim import replay_env

    from dask_influx_metrics import Monitor
    from dask_influx_metrics.client import summary as S
    from dask_influx_metrics.client.query.metricnames import natural_key

    for key, value in replay_env(tmp_path, recording="nvml_h200_shared.json").items():
        monkeypatch.setenv(key, value)  # the workers' agent imports the replay (the workers inherit this)
    monkeypatch.setenv("DASK_DISTRIBUTED__DIAGNOSTICS__NVML", "False")
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        holder, matmul = sorted(pids, key=natural_key)
        client.run(_set_env, {"FAKE_NVML_PIDS": f"668={pids[holder]},666={pids[matmul]}"})
        monitor = Monitor(
            client,
            sink=["http", "spool"],
            influxdb_url=influxd.url,
            database=fresh_db,
            spool_directory=str(tmp_path / "spool"),
            gpu_source="nvml",
        )
        tracking = ["compute-util", "total-mem", "worker-gpu-mem", "gpm", "worker-gpu-util", "task-stream"]
        monitor.attach(tracking=tracking, polling_interval=200, job_type="manual")
        monitor.start()
        try:
            monitor.new_job()
            hold = client.submit(_hold, 2.5, key="hold-1", workers=[holder])
            monitor.new_job()
            work = client.submit(_hold, 2.5, key="matmul-1", workers=[matmul])
            client.gather([hold, work])
        finally:
            monitor.stop()
        _check_shared_h200("spool", monitor.query(), holder, matmul, S)
        _check_shared_h200("influxql", monitor.query(source=influxd.url, database=fresh_db), holder, matmul, S)
        monitor.shutdown()


def _check_shared_h200(kind, db, holder, matmul, S):
    assert db.workers() == [holder, matmul], kind
    tables = query.worker_tables(db, metrics=["total-mem", "compute-util"])
    for worker, job in ((holder, 1), (matmul, 2)):
        table = tables[worker]
        assert "total-mem[0]" in table.columns, f"{kind}: worker {worker} has its GPU column"
        busy = table[table["dag"] != "0"]
        assert set(busy["job"]) == {str(job)}, f"{kind}: worker {worker}'s busy rows are its own job's only"
    peaks = query.get_peaks(db, "total-mem")
    assert [set(p) for p in peaks] == [{1}, {2}], f"{kind}: {peaks}"
    device = query.get_peaks(db, "total-mem", per_job=False)  # the device's peak over the session
    assert peaks[1][2][0] == pytest.approx(device[1][0], rel=0.01) == 18352570368
    prefix = query.gpu_per_prefix(db).set_index("prefix")
    assert prefix.loc["hold", "mean_sm_active"] <= 5 and prefix.loc["matmul", "mean_sm_active"] >= 90, kind
    assert prefix.loc["hold", "mean_device_sm_active"] >= 90, f"{kind}: the device was busy meanwhile"
    per_job = query.gpu_during_tasks(db).set_index("job")
    jobs = per_job[per_job["dag"].isna()]
    assert jobs.loc[1, "mean_sm_active"] + jobs.loc[2, "mean_sm_active"] <= jobs["mean_device_sm_active"].min() + 1e-9
    s = query.summary(db, per_job=False)
    gpu = s[s["resource"] == "gpu"]
    every = gpu[gpu["worker"] == S.ALL].iloc[0]
    first, last = db.backend.first_time(), db.backend.last_time()
    wall = (last - first) / 1e9 + 0.2  # the first sample stands for one interval
    assert every["devices"] == 1 and every["device_hours"] * 3600 == pytest.approx(wall, rel=0.02), kind
    mine = gpu[gpu["worker"] != S.ALL]
    assert mine["device_hours"].sum() == pytest.approx(2 * every["device_hours"], rel=0.05), "each worker's own view"
