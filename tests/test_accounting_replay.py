"""Accounting on replayed NVML output (the H100 and H200 recordings of a GPU shared by a bf16 matmul loop and a
process only holding 12.5 GiB): each job's own busy time and energy, conservation against the recorded energy
counter, and shares that start with the work (issue 49's busy/memory-only case) read back from a spool.

The "workers" are what the agent keeps per worker, read by one :class:`HostCollector` over one
:class:`NvmlDevices` on :class:`fake_nvml.FakeNvml`, on a simulated clock (the per-process read once a second,
the energy counter every 10 s, as in production).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pynvml
import pytest
from fake_nvml import FakeNvml
from test_gpu_attribution import Worker

from dask_influx_metrics import lineprotocol, query
from dask_influx_metrics.sampling import accounting as A
from dask_influx_metrics.sampling.collect import HostCollector
from dask_influx_metrics.sampling.sources import procutil
from dask_influx_metrics.sampling.sources.nvml import NvmlDevices
from dask_influx_metrics.schema import FIELDS, GPU, Point
from dask_influx_metrics.sinks.spool import SpoolSink

ALL = frozenset(k for k in FIELDS if k[0] == GPU)
STEP = 0.2
T0 = 1_795_751_870.0  # the tests' wall clock starts here (Unix s, the H200 recording's day)
RECORDINGS = {"h100": ("nvml_h100_shared.json", 425, 427), "h200": ("nvml_h200_shared.json", 666, 668)}


class Clock:
    """The test's time: ``t`` s after :data:`T0`; monotonic for the readers' pacing, wall for NVML's stamps."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def wall(self):
        return T0 + self.t


def collector_on(nvml, clock, pids):
    """``(collector, workers, accounting)``: a worker per recorded pid, NVML read on ``clock``."""
    gpus = NvmlDevices(ALL, nvml=nvml)
    workers = [Worker(i + 1, pid) for i, pid in enumerate(pids)]
    for w in workers:
        w.uuids = gpus.resolve(w)
    dev = gpus._devices[workers[0].uuids[0]]
    dev.procs._clock, dev.procs._wall, dev.slow._clock = clock, clock.wall, clock
    dev.gpm_reader._clock = clock
    acc = A.Accounting(1.0, STEP, {"host": "node", "worker": "agent-node"}, since_ns=int(T0 * 1e9), clock=clock)
    return HostCollector(ALL | {("accounting", "busy_seconds")}, gpus, None, accounting=acc), workers, acc


def sample(collector, workers, clock, sink, final=False):
    now_ns = int(clock.wall() * 1e9)
    sink.send(lineprotocol.encode_many(collector.collect(workers, now_ns=now_ns, final=final)))


@pytest.mark.parametrize("recording", sorted(RECORDINGS))
def test_shared_gpu_the_matmuls_job_gets_the_busy_time_and_energy_the_holders_none(tmp_path, recording):
    """Both jobs run the whole time on the replayed shared GPU: the matmul's job gets >= 97 % of the device's
    busy time and the energy of its share, the holder's job <= 2 %; jobs + idle = the energy counter's delta."""
    name, matmul, holder = RECORDINGS[recording]
    nvml, clock = FakeNvml(name), Clock()
    collector, (a, b), acc = collector_on(nvml, clock, (matmul, holder))
    a.run(1, 1)
    b.run(2, 2)
    sink = SpoolSink(tmp_path / "20260101T000000-000001" / "agent-node")
    for k in range(26):  # 5 s
        clock.t = k * STEP
        sample(collector, [a, b], clock, sink, final=k == 25)
    sink.close()
    with query.connect(str(tmp_path)) as db:
        table = query.accounting(db).set_index(["job", "uuid"], drop=False)
        gpu = db.backend.frame("gpu", ["utilization_gpu", "total_energy_consumption"], a.address)
    uuid = a.uuids[0]
    one, two, idle = table.loc[(1, uuid)], table.loc[(2, uuid)], table[table["job"].isna() & table["uuid"].notna()]
    device_busy = one["busy_seconds"] + two["busy_seconds"] + idle["busy_seconds"].sum()
    assert device_busy == pytest.approx(sum(gpu["utilization_gpu"]) / 100 * STEP, rel=1e-6)
    assert one["busy_seconds"] >= 0.97 * device_busy and two["busy_seconds"] <= 0.02 * device_busy
    counter = gpu["total_energy_consumption"].dropna()
    delta = (counter.iloc[-1] - counter.iloc[0]) / 1000
    energy = one["energy_joules"] + two["energy_joules"] + idle["energy_joules"].sum()
    assert len(counter) >= 2 and energy == pytest.approx(delta, rel=0.01), "jobs + idle = the counter's delta"
    assert one["energy_joules"] >= 0.97 * delta and two["energy_joules"] <= 0.02 * delta
    assert one["memory_peak_bytes"] == 4909432832 or recording == "h100"  # the matmul's process, recorded
    assert table.loc[(2, uuid), "memory_peak_bytes"] > 12 * 2**30, "the holder's 12.5 GiB are its own"


class LaggingDriver(FakeNvml):
    """The H200 recording following a script, with a driver whose per-process samples trail the kernels.

    The matmul's kernels run in ``kernels`` (s of the test clock): the device reads the shared phase then and
    the idle phase otherwise (utilization: 99 % x the busy part of the last 200 ms). The driver takes a
    per-process sample every ``period`` s (at ``phase``), each listing a process with its kernel time in that
    period; a call returns the latest sample newer than its timestamp argument, NotFound when there is none or
    it lists nobody. So a read soon after the kernels began finds nobody yet (as NVML does on a real GPU)."""

    def __init__(self, clock, kernels, period=1.0, phase=0.05, matmul=666, holder=668):
        super().__init__("nvml_h200_shared.json", phase="idle")
        self.clock, self.kernels, self.period, self.phase, self.pids = clock, kernels, period, phase, (matmul, holder)
        self.busy_record = self.data["phases"]["shared"]["devices"][0]
        self.idle_record = self.data["phases"]["idle"]["devices"][0]

    def _busy(self, start, end) -> float:
        s, e = self.kernels
        return max(0.0, min(end, e) - max(start, s)) / (end - start)

    def _record(self, handle):
        t = self.clock.t
        return self.busy_record if self._busy(t - STEP, t) > 0 else self.idle_record

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._check_init()
        t = self.clock.t
        return SimpleNamespace(gpu=round(99 * self._busy(t - STEP, t)), memory=round(24 * self._busy(t - STEP, t)))

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(**p) for p in self.busy_record["compute_processes"][0]]  # both hold memory

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle, timeStamp):
        self._check_init()
        g = self.phase + math.floor((self.clock.t - self.phase) / self.period) * self.period
        stamp = int((T0 + g) * 1e6)
        util = round(99 * self._busy(g - self.period, g))
        if stamp <= timeStamp or not util:
            raise pynvml.NVMLError_NotFound()
        return [SimpleNamespace(pid=self.pids[0], timeStamp=stamp, smUtil=util, memUtil=util // 4)]

    nvmlDeviceGetProcessUtilization = nvmlDeviceGetProcessesUtilizationInfo


def _lagging_run(tmp_path, deferred: int, monkeypatch):
    """Two workers on the H200: worker 1 runs job 1 (the matmul: kernels 2.1-8.1 s), worker 2 job 2 (holds
    12.5 GiB, 0.4-9.6 s); sampled every 200 ms for 10 s; the task stream of both; read back from a spool."""
    monkeypatch.setattr(procutil, "DEFER_READS", deferred)
    clock = Clock()
    nvml = LaggingDriver(clock, kernels=(2.1, 8.1))
    collector, (a, b), acc = collector_on(nvml, clock, (666, 668))
    folder = tmp_path / f"defer{deferred}"
    sink = SpoolSink(folder / "20260101T000000-000001" / "agent-node")
    for k in range(51):
        clock.t = k * STEP
        a.run(1, 1) if 2.0 <= clock.t < 8.2 else a.idle()
        b.run(2, 2) if 0.4 <= clock.t < 9.6 else b.idle()
        sample(collector, [a, b], clock, sink, final=k == 50)
    tasks = [(a, 1, "matmul", 2.0, 8.2), (b, 2, "hold", 0.4, 9.6)]
    sink.send(
        lineprotocol.encode_many(
            Point(
                "task",
                {**w.tags, "job": str(job), "dag": str(job), "prefix": prefix, "state": "memory"},
                {"key": prefix, "start": T0 + start, "duration": end - start},
                int((T0 + end) * 1e9),
            )
            for w, job, prefix, start, end in tasks
        )
    )
    sink.close()
    with query.connect(str(folder)) as db:
        table = query.accounting(db)
        summary = query.summary(db, per_job=True)
        prefix = query.gpu_per_prefix(db).set_index("prefix")
    gpu = summary[(summary["resource"] == "gpu") & summary["job"].notna() & (summary["worker"] != "all workers")]
    device = {int(r["job"]): (r["device_hours"] - r["unused_device_hours"]) * 3600 for _, r in gpu.iterrows()}
    own = {int(r["job"]): r["busy_seconds"] for _, r in table[table["host"].isna() & table["job"].notna()].iterrows()}
    per_prefix = {
        p: prefix.loc[p, "mean_utilization_gpu"] / prefix.loc[p, "mean_device_utilization_gpu"] for p in prefix.index
    }
    return {job: own[job] / device[job] for job in (1, 2)}, per_prefix


def test_shares_start_with_the_work_the_busy_job_gets_its_first_second(tmp_path, monkeypatch):
    """Issue 49's case (job 1's kernels for 6 s, job 2 only holds memory, two workers on one GPU), with a driver
    whose per-process sample trails the kernels by up to a second: the busy job reads >= 97 % of the device's
    busy time during its tasks, accounting and per task prefix alike, the memory-only job <= 2 %. Without the
    deferred window (``DEFER_READS = 0``, as before) the first second is charged to nobody."""
    accounting, per_prefix = _lagging_run(tmp_path, procutil.DEFER_READS, monkeypatch)
    assert accounting[1] >= 0.97 and accounting[2] <= 0.02, accounting
    assert per_prefix["matmul"] >= 0.97 and per_prefix["hold"] <= 0.02, per_prefix
    before, before_prefix = _lagging_run(tmp_path, 0, monkeypatch)
    assert before[1] < 0.9 and before_prefix["matmul"] < 0.9, (before, before_prefix)  # the harness shows the loss
