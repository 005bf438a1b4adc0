"""SimulatedGpuSource: readings follow the worker's activity, within physical bounds."""

from __future__ import annotations

import random

import pytest

from dask_influx_metrics.agent.sources.simulated import NAME, SimulatedGpuSource, SimulatedHandle
from dask_influx_metrics.schema import FIELDS, GPU
from dask_influx_metrics.snapshot import Activity

ALL = frozenset(k for k in FIELDS if k[0] == GPU)
MIB = 2**20


class Worker:
    """A settable activity snapshot."""

    def __init__(self, nthreads=4):
        self.snap = Activity(running=(), nthreads=nthreads, managed_bytes=0, last_job=0)

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
