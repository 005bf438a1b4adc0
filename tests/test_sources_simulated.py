"""SimulatedGpuSource: readings follow the worker's activity, within physical bounds."""

from __future__ import annotations

import random

import pytest

from dask_influx_metrics import query
from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.sampling.sources.simulated import NAME, SimulatedGpuSource, SimulatedHandle
from dask_influx_metrics.schema import FIELDS, GPU

ALL = frozenset(k for k in FIELDS if k[0] == GPU)
MIB = 2**20


class Worker:
    """A settable activity snapshot."""

    def __init__(self, nthreads=4):
        self.snap = Snapshot(running=(), nthreads=nthreads, managed_bytes=0, last_job=0)

    def set(self, executing=0, managed_bytes=0):
        running = tuple((("t", i), 1, 1) for i in range(executing))
        self.snap = self.snap._replace(running=running, managed_bytes=managed_bytes)

    def __call__(self):
        return self.snap


def test_idle_reads_idle():
    w = Worker()
    (r,) = SimulatedGpuSource(1, ALL, w).read()
    assert r.measurement == GPU and r.tags["index"] == "0" and r.tags["name"] == NAME
    assert r.tags["uuid"].startswith("SIM-")
    assert r.fields == {
        "utilization_gpu": 0.0,
        "utilization_memory": 0.0,
        "memory_used": 400.0,
        "memory_total": 81920.0,
        "memory_used_percent": 100 * 400 / 81920,
        "power_draw": 60.0,
        "temperature_gpu": 35.0,
        "clocks_current_sm": 210.0,
        "total_energy_consumption": 1_000_000,  # the counter, in the first reading (as NVML's)
    }
    for name, value in r.fields.items():
        assert type(value) is FIELDS[GPU, name].type, name


def test_busy_reads_busy_and_heats_up():
    w = Worker(nthreads=2)
    src = SimulatedGpuSource(2, ALL, w)
    w.set(executing=2)
    temps = []
    for _ in range(10):
        for r in src.read():
            f = r.fields
            assert 92.0 <= f["utilization_gpu"] <= 100.0
            assert f["utilization_memory"] == pytest.approx(0.6 * f["utilization_gpu"])
            assert 60 + 340 * 0.92 <= f["power_draw"] <= 400.0
            assert f["clocks_current_sm"] == 1410.0
        temps.append(src.read()[0].fields["temperature_gpu"])
    assert temps[0] < temps[2] < temps[5] and 73.0 < temps[-1] <= 80.0  # smoothed, jittered
    w.set(executing=1)  # half the threads busy
    assert all(46.0 <= r.fields["utilization_gpu"] <= 50.0 for r in src.read())
    w.set(executing=0)
    assert [r.fields["clocks_current_sm"] for r in src.read()] == [210.0, 210.0]
    assert src.read()[0].fields["temperature_gpu"] < temps[-1]  # cooling, smoothly


def test_memory_follows_managed_bytes_and_is_capped():
    w = Worker()
    src = SimulatedGpuSource(2, ALL, w, memory_total_mib=16384.0)
    w.set(managed_bytes=2 * 1024 * MIB)
    assert [r.fields["memory_used"] for r in src.read()] == [1424.0, 1424.0]  # 400 + 2048 / 2
    w.set(managed_bytes=10**15)
    for r in src.read():
        assert r.fields["memory_used"] == r.fields["memory_total"] == 16384.0
        assert r.fields["memory_used_percent"] == 100.0


def test_values_stay_within_physical_bounds():
    w = Worker(nthreads=3)
    src = SimulatedGpuSource(4, ALL, w, seed=7)
    rng = random.Random(1)
    for _ in range(300):
        w.set(executing=rng.randint(0, 5), managed_bytes=rng.randint(0, 10**12))
        for r in src.read():
            f = r.fields
            assert 0.0 <= f["utilization_gpu"] <= 100.0 and 0.0 <= f["utilization_memory"] <= 60.0
            assert 400.0 <= f["memory_used"] <= f["memory_total"]
            assert 0.0 < f["memory_used_percent"] <= 100.0
            assert 60.0 <= f["power_draw"] <= 400.0 and 35.0 <= f["temperature_gpu"] <= 80.0
            assert f["clocks_current_sm"] in (210.0, 1410.0)


def run(seed, steps=50):
    w = Worker(nthreads=2)
    src = SimulatedGpuSource(3, ALL, w, seed=seed)
    out = []
    for i in range(steps):
        w.set(executing=i % 3, managed_bytes=i * MIB)
        out.append([r.fields for r in src.read()])
    return out, [r.tags for r in src.read()]


def test_deterministic():
    assert run(0) == run(0)
    assert run(0)[0] != run(1)[0]  # the seed moves the jitter
    assert run(0)[1] == run(1)[1]  # but not the identity of the devices


def test_only_requested_fields():
    w = Worker()
    w.set(executing=4)
    src = SimulatedGpuSource(2, frozenset({(GPU, "power_draw"), ("host", "cpu_percent")}), w)
    assert [set(r.fields) for r in src.read()] == [{"power_draw"}, {"power_draw"}]
    assert SimulatedGpuSource(2, frozenset({("host", "cpu_percent")}), w).read() == []


def test_handles_and_devices():
    src = SimulatedGpuSource(3, ALL, Worker())
    handles = src.handles
    assert [h.index for h in handles] == [0, 1, 2] and all(isinstance(h, SimulatedHandle) for h in handles)
    assert len({h.uuid for h in handles}) == 3
    assert [h.uuid for h in SimulatedGpuSource(3, ALL, Worker()).handles] == [h.uuid for h in handles]
    assert src.devices == [(h.index, h.uuid, NAME) for h in handles]
    assert [r.tags["uuid"] for r in src.read()] == [h.uuid for h in handles]
    src.close()


def test_no_devices_and_no_threads():
    assert SimulatedGpuSource(0, ALL, Worker()).read() == []
    w = Worker(nthreads=0)
    w.set(executing=1)
    assert SimulatedGpuSource(1, ALL, w).read()[0].fields["utilization_gpu"] == 0.0
    with pytest.raises(ValueError):
        SimulatedGpuSource(-1, ALL, w)


def test_utilization_is_the_busy_share_since_the_previous_read():
    """Issue 33 item 3: like NVML, each read averages the time since the previous one (the worker's busy
    thread-seconds), so a task that starts and ends between two reads is seen in proportion."""
    now = [0.0]
    w = Worker(nthreads=2)
    w.snap = w.snap._replace(busy=0.0)  # the worker counts its busy time: idle so far
    src = SimulatedGpuSource(1, frozenset({(GPU, "utilization_gpu")}), w, clock=lambda: now[0])
    now[0] = 2.0
    assert src.read()[0].fields["utilization_gpu"] == 0.0  # the first read: as now (idle)
    w.snap = w.snap._replace(busy=2.15 - 2.05)  # one thread busy 100 ms, ended
    now[0] = 2.2
    assert 23.0 <= src.read()[0].fields["utilization_gpu"] <= 25.0  # 0.1 s / (0.2 s x 2 threads)
    w.snap = w.snap._replace(busy=0.1 - 2 * 2.3, busy_n=2)  # both threads busy since 2.3
    now[0] = 2.4
    assert 46.0 <= src.read()[0].fields["utilization_gpu"] <= 50.0  # half the window, on both threads
    now[0] = 2.6
    assert src.read()[0].fields["utilization_gpu"] >= 92.0
    w.snap = w.snap._replace(busy=None)  # a worker without the counter: executing / nthreads at the read
    assert src.read()[0].fields["utilization_gpu"] == 0.0


def _pause(seconds):
    import threading

    threading.Event().wait(seconds)


def test_short_tasks_read_their_time_weighted_share_on_a_cluster(tmp_path):
    """Issue 33 item 3's target: one 30 ms task every 250 ms, sampled every 200 ms: the summary's
    time-weighted mean utilization of the simulated GPU is within 10 % of the truth from the task points
    (task seconds over the wall time the samples cover; was 50.4 % against 11.4 % when a read said "busy now")."""
    import threading
    import time

    from distributed import Client, LocalCluster

    from dask_influx_metrics import Monitor

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        monitor = Monitor(client, sink="spool", spool_directory=str(tmp_path), gpu_source="simulated", gpu_count=1)
        monitor.attach(tracking=["compute-util", "task-stream"], polling_interval=200)
        monitor.start()
        try:
            futures, start = [], time.monotonic()
            for k in range(20):  # 5 s
                futures.append(client.submit(_pause, 0.03, key=f"short-{k}"))
                threading.Event().wait(max(0.0, start + (k + 1) * 0.25 - time.monotonic()))
            client.gather(futures)
        finally:
            monitor.stop()
        db = monitor.query()
        summary = query.summary(db, per_job=False)
        gpu = summary[summary["resource"] == "gpu"].iloc[0]
        tasks = query.task_stream(db)
        monitor.shutdown()
    truth = 100 * tasks["duration"].astype(float).sum() / (gpu["hours"] * 3600)
    assert len(tasks) == 20 and 9 < truth < 15, truth
    assert gpu["mean"] == pytest.approx(truth, rel=0.10), (gpu["mean"], truth)


def test_energy_counter_adds_power_times_time_and_comes_like_nvmls():
    """The counter (mJ) integrates power_draw over the time between reads; it is written at the first read,
    then every 10 s (slowfields.COUNTER_INTERVAL_S) and on a final read, as the agent reads NVML's."""
    w, now = Worker(nthreads=1), [100.0]
    src = SimulatedGpuSource(1, ALL, w, clock=lambda: now[0])
    first = src.read()[0].fields["total_energy_consumption"]
    w.set(executing=1)
    powers, counters = [], []
    for _ in range(60):  # 12 s at 200 ms
        now[0] += 0.2
        fields = src.read()[0].fields
        powers.append(fields["power_draw"])
        counters.append(fields.get("total_energy_consumption"))
    assert [i for i, c in enumerate(counters) if c is not None] == [49]  # 10 s after the first
    assert counters[49] - first == pytest.approx(sum(p * 0.2 for p in powers[:50]) * 1000, abs=1)
    now[0] += 0.2
    assert "total_energy_consumption" in src.read(final=True)[0].fields
