"""Each worker's live figures from a sample's points (sampling/live.py): what the dashboard page gets."""

from __future__ import annotations

from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.sampling.live import SHARE_KEEP_S, UNKNOWN, LiveFigures
from dask_influx_metrics.schema import GPU, HOST, Point


class View:
    def __init__(self, wid, uuids, running=()):
        self.id, self.address, self.uuids = wid, f"tcp://w:{wid}", list(uuids)
        self.running = running

    def snapshot(self):
        return Snapshot(tuple(self.running), 4, 0, 1)


def gpu(view, uuid, **fields):
    return Point(GPU, {"worker": view.address, "uuid": uuid, "job": "1", "dag": "1"}, fields, 0)


def test_an_entry_per_worker_in_its_gpu_order_with_jobs_and_prefixes():
    a = View("1", ["GPU-b", "GPU-a"], [(("mm-1", 0), 2, 5), (("mm-1", 1), 2, 5), ("sum-2", 3, 6), (None, 3, 6)])
    idle = View("2", ["GPU-c"])
    points = [
        gpu(a, "GPU-a", utilization_gpu=10.4, memory_used=100.6, memory_total=1000.0, sm_active=7.5),
        gpu(a, "GPU-b", utilization_gpu=99.6, memory_total=1000.0, worker_memory_used=50.2),
        Point(HOST, {"worker": a.address}, {"cpu_percent": 5.0}, 0),
    ]
    live = LiveFigures()
    assert live.update([a, idle], points, now=0.0)
    assert live.entries["1"] == {
        "jobs": [[2, 2], [3, 2]],  # a folded entry (no key) still counts for its job
        "prefixes": ["mm", "sum"],
        "gpus": [[100, None, 1000, None, None, 50], [10, 101, 1000, 8, None, None]],  # GPU-b, then GPU-a
    }
    assert live.entries["2"] == {"jobs": [], "prefixes": [], "gpus": [[None, None, None, None, None, None]]}


def test_the_version_moves_only_when_an_entry_changes():
    a = View("1", ["GPU-a"])
    live = LiveFigures()
    assert live.update([a], [gpu(a, "GPU-a", utilization_gpu=5.0)], now=0.0)
    version = live.version
    assert not live.update([a], [gpu(a, "GPU-a", utilization_gpu=5.2)], now=0.5)  # rounds alike
    assert live.version == version
    assert live.update([a], [gpu(a, "GPU-a", utilization_gpu=50.0)], now=1.0)
    assert live.version == version + 1


def test_a_share_stands_between_its_reads_then_is_unknown_on_a_shared_gpu():
    a, b = View("1", ["GPU-s"]), View("2", ["GPU-s"])
    live = LiveFigures()
    both = [gpu(a, "GPU-s", utilization_gpu=90.0, worker_gpu_share=97.0), gpu(b, "GPU-s", utilization_gpu=90.0)]
    live.update([a, b], both, now=0.0, shared={"GPU-s"})
    assert live.entries["1"]["gpus"][0][4] == 97
    assert live.entries["2"]["gpus"][0][4] == UNKNOWN  # shared, never read: its own figures are not known
    device_only = [gpu(a, "GPU-s", utilization_gpu=90.0), gpu(b, "GPU-s", utilization_gpu=90.0)]
    live.update([a, b], device_only, now=SHARE_KEEP_S, shared={"GPU-s"})
    assert live.entries["1"]["gpus"][0][4] == 97  # between the once-a-second reads
    live.update([a, b], device_only, now=SHARE_KEEP_S + 0.6, shared={"GPU-s"})
    assert live.entries["1"]["gpus"][0][4] == UNKNOWN
    live.update([a], device_only[:1], now=SHARE_KEEP_S + 1.2, shared=set())  # b left: not shared any more
    assert live.entries["1"]["gpus"][0][4] is None  # its own figures are the device's


def test_shares_read_between_rebuilds_are_kept():
    a = View("1", ["GPU-s"])
    live = LiveFigures()
    live.update([a], [gpu(a, "GPU-s", utilization_gpu=90.0)], now=0.0, shared={"GPU-s"})
    assert live.entries["1"]["gpus"][0][4] == UNKNOWN
    live.observe([gpu(a, "GPU-s", utilization_gpu=90.0, worker_gpu_share=60.0)], now=0.2)  # a sample between
    live.update([a], [gpu(a, "GPU-s", utilization_gpu=90.0)], now=0.5, shared={"GPU-s"})
    assert live.entries["1"]["gpus"][0][4] == 60


def test_a_jobs_energy_is_not_known_until_its_gpus_counter_is_read_then_it_is_the_counters():
    """The heartbeat's accounting rows from a real Accounting: energy is the job's part of the counter's
    delta, so before the counter's first read since the job began it is None (the page's "-"), not 0."""
    from dask_influx_metrics.sampling.accounting import Accounting
    from dask_influx_metrics.sampling.live import accounting_rows

    acc = Accounting(interval_s=10, step_s=0.5, tags={"host": "h", "worker": "agent-h"}, since_ns=0)
    busy = Snapshot(((("k", 0), 7, 1),), 1, 0, 7)

    def sample(k, counter=None):
        device = {"utilization_gpu": 80.0, "power_draw": 300.0}
        if counter is not None:
            device["total_energy_consumption"] = counter
        workers = [("w", "tcp://w:1", busy, {})]
        acc.update(k * 500_000_000, k * 500_000_000, [("GPU-1", device, {"index": "0"}, [("w", {})])], workers)
        return accounting_rows(acc.live())

    assert sample(0, counter=1_000_000) == [[7, 40, None, 80, None, None, 1]]  # the counter's first read
    assert sample(1)[0][1:3] == [80, None]  # provisional energy is not the job's total
    assert sample(2, counter=1_300_000)[0][1:3] == [120, 300]  # read again: the delta, all the job's
