"""Issue 10, worker side: each physical GPU written once per host, tagged with the jobs of its users.

Replays real NVML output through ``tests/fake_nvml.py``: the H100 shared by two
processes (``nvml_h100_shared.json``: 'matmul' holds 4682 MiB, 'holder' 12806 MiB),
and four GPUs under dask-cuda's rotated ``CUDA_VISIBLE_DEVICES`` lists. Each
"worker" is an :class:`NvmlSource` with its own fake NVML and its own pid (a
sleeping process, so liveness checks see it), sharing one session folder.
"""

import subprocess
import sys
from collections import Counter

import pytest
from fake_nvml import FakeNvml

from dask_influx_metrics.schema import FIELDS, GPU
from dask_influx_metrics.names import EVENT_TOPIC, SHARED_GPU
from dask_influx_metrics.scheduler.plugin import JobPlugin
from dask_influx_metrics.worker.sources.activity import Activity
from dask_influx_metrics.worker.sources.nvml import NvmlSource

ALL = frozenset(k for k in FIELDS if k[0] == GPU)
DEVICE_WIDE = {"utilization_gpu", "memory_used", "power_draw", "clocks_event_reasons"}
MIB = 2**20


@pytest.fixture
def pids():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(4)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


class Doing:
    """A worker's activity that a test sets: ``doing.run(job, dag)`` / ``doing.idle()``."""

    def __init__(self):
        self.snap = Activity((), 1, 0, 0)

    def run(self, job, dag):
        self.snap = Activity((("task", job, dag),), 1, 0, job)

    def idle(self):
        self.snap = Activity((), 1, 0, self.snap.last_job)

    def __call__(self):
        return self.snap


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


def test_two_workers_sharing_an_h100(tmp_path, pids):
    a_pid, b_pid = pids[:2]
    a_doing, b_doing = Doing(), Doing()
    a = NvmlSource(ALL, visible=None, nvml=h100({425: a_pid, 427: b_pid}), pid=a_pid, share_dir=str(tmp_path),
                   activity=a_doing, devices="auto")
    b = NvmlSource(ALL, visible=None, nvml=h100({425: a_pid, 427: b_pid}), pid=b_pid, share_dir=str(tmp_path),
                   activity=b_doing, devices="auto")
    a_doing.run(1, 1)
    first = a.read()  # a takes the GPU's lock first: it owns it
    assert len(first) == 1 and first[0].tags["nvml_index"] == "0"
    assert first[0].fields["worker_memory_used"] == 4909432832 / MIB  # its own process: 4682 MiB
    assert DEVICE_WIDE <= set(first[0].fields) and "job" not in first[0].tags  # own jobs: the sampler's tags

    a_doing.idle()
    b_doing.run(2, 7)
    mine, = b.read()  # b does not own the GPU: its own memory only, with its own tags
    assert mine.fields == {"worker_memory_used": 13428064256 / MIB} and "job" not in mine.tags
    device, own = a.read()
    assert (device.tags["job"], device.tags["dag"]) == ("2", "7"), "job 2 runs on a worker using the GPU"
    assert DEVICE_WIDE <= set(device.fields) and "worker_memory_used" not in device.fields
    assert own.fields == {"worker_memory_used": 4909432832 / MIB} and "job" not in own.tags, \
        "job 1's worker is idle: its memory stays on its own (idle) tags, never job 2's"

    b_doing.idle()
    b.read()  # a worker's state reaches the others with its next sample
    idle, = a.read()
    assert "job" not in idle.tags, "nobody runs a task: one point on the owner's own idle tags (dag 0)"
    a.close()
    again = b.read()
    assert any(DEVICE_WIDE <= set(r.fields) for r in again), "the owner left: the other user takes over"
    b.close()


@pytest.mark.parametrize("workers", [2, 4])
def test_dask_cuda_rotated_lists_write_each_gpu_once(tmp_path, pids, workers):
    sources = [NvmlSource(ALL, visible=rotated(i, 4), nvml=four_gpus(), pid=pids[i], share_dir=str(tmp_path),
                          activity=Doing(), devices="auto") for i in range(workers)]
    try:
        readings = [s.read() for s in sources]
        uuids = [[r.tags["uuid"] for r in rs] for rs in readings]
        physical = FakeNvml().devices
        assert uuids == [[physical[i]["uuid"]] for i in range(workers)], "each worker reports its own GPU"
        assert all(r.tags["index"] == "0" for rs in readings for r in rs)
        written = Counter(r.tags["uuid"] for rs in readings for r in rs if "utilization_gpu" in r.fields
                          or "memory_used" in r.fields)
        assert set(written.values()) == {1}, f"a device series written twice: {written}"
    finally:
        for s in sources:
            s.close()


def test_plain_workers_seeing_every_gpu_write_each_once(tmp_path, pids):
    sources = [NvmlSource(ALL, visible=None, nvml=four_gpus(), pid=pids[i], share_dir=str(tmp_path),
                          activity=Doing(), devices="auto") for i in range(3)]
    try:
        rounds = [[r for s in sources for r in s.read()] for _ in range(3)]
        for readings in rounds:
            device_points = Counter(r.tags["uuid"] for r in readings if "memory_used" in r.fields)
            assert len(device_points) == 4 and set(device_points.values()) == {1}, device_points
            per_worker = Counter(r.tags["uuid"] for r in readings if "worker_memory_used" in r.fields)
            assert set(per_worker.values()) == {3}, "every worker writes its own memory on each GPU it uses"
    finally:
        for s in sources:
            s.close()


def test_shared_gpu_is_reported_once_and_reaches_the_scheduler(tmp_path, pids):
    reports = []
    sources = [NvmlSource(ALL, visible=None, nvml=h100({}), pid=pids[i], share_dir=str(tmp_path), activity=Doing(),
                          report=lambda what, message, **d: reports.append((what, d)), devices="auto")
               for i in range(2)]
    for _ in range(30):
        for s in sources:
            s.read()
    shared = [d for what, d in reports if what == SHARED_GPU]
    assert len(shared) == 2 and all(d["pids"] == sorted(pids[:2]) for d in shared), reports
    plugin = JobPlugin({}, worker_payload=b"")
    for worker, d in zip(["tcp://w:1", "tcp://w:2"], shared):
        plugin.log_event(EVENT_TOPIC, {**d, "what": SHARED_GPU, "host": "node", "worker": worker})
    assert plugin.state()["shared_gpus"] == [
        {"host": "node", "uuid": "GPU-da1f6fd4-9109-0cfa-82af-30bfade809cb", "workers": ["tcp://w:1", "tcp://w:2"]}]
    for s in sources:
        s.close()


def test_per_worker_memory_left_out_in_a_container(monkeypatch):
    from dask_influx_metrics.worker.sources import nvml as nvml_mod

    monkeypatch.setattr(nvml_mod, "host_pid_problem", lambda: "own PID namespace (test)")
    reports = []
    src = NvmlSource(ALL, visible=None, nvml=h100({}), report=lambda what, message, **d: reports.append(message))
    reading, = src.read()
    assert "worker_memory_used" not in reading.fields and "memory_used" in reading.fields
    assert reports == ["per-worker GPU memory left out: own PID namespace (test)"]
