import statistics
import threading
import time

import pytest
from listsink import ListSink
from polling import wait_until

from dask_influx_metrics.sampling.sampler import Sampler
from dask_influx_metrics.schema import Point

TAGS = {"host": "h", "worker": "w", "job": "1", "dag": "2"}


def static(*points):
    """``collect``: the given (measurement, tags, fields), timed at the sample's time."""
    return lambda now_ns: [Point(m, {**TAGS, **tags}, dict(fields), now_ns) for m, tags, fields in points]


def test_sample_returns_the_collected_points_at_one_time_now():
    asked = []

    def collect(now_ns):
        asked.append(now_ns)
        return static(("worker", {}, {"tasks": 1}), ("gpu", {"index": "0"}, {"utilization_gpu": 1.0}))(now_ns)

    s = Sampler(collect, ListSink())
    points = {p.measurement: p for p in s.sample()}
    assert points["worker"].fields == {"tasks": 1}
    assert points["gpu"].tags == {**TAGS, "index": "0"}
    assert len(asked) == 1 and {p.time_ns for p in points.values()} == set(asked)
    assert asked[0] / 1e9 == pytest.approx(time.time(), abs=1.0)


def test_thread_samples_on_schedule_and_a_failing_collect_does_not_stop_it(caplog):
    sink, calls = ListSink(), []
    good = static(("host", {}, {"cpu_percent": 1.0}))

    def collect(now_ns):
        calls.append(now_ns)
        if len(calls) % 2:
            raise RuntimeError("sensor on fire")
        return good(now_ns)

    s = Sampler(collect, sink, interval=0.02)
    s.start()
    try:
        wait_until(lambda: s.samples >= 15)
    finally:
        s.stop()
    assert not s.running
    assert len(sink.lines) >= 15 and all(line.startswith(b"host,") for line in sink.lines)
    assert statistics.median(s.gaps) == pytest.approx(0.02, abs=0.01)
    assert sum("sensor on fire" in r.getMessage() for r in caplog.records) == 1


def test_a_raising_sink_is_reported_once_and_sampling_goes_on(caplog):
    class Broken:
        def send(self, lines):
            raise OSError("disk full")

    s = Sampler(static(("host", {}, {"cpu_percent": 1.0})), Broken(), interval=0.01)
    s.start()
    try:
        wait_until(lambda: s.samples >= 5)
    finally:
        s.stop()
    assert sum("disk full" in r.getMessage() for r in caplog.records) == 1


def test_slow_samples_skip_ticks_instead_of_bursting():
    def slow(now_ns):
        threading.Event().wait(0.05)  # collecting itself is slow (simulated work)
        return []

    s = Sampler(slow, ListSink(), interval=0.01)
    s.start()
    try:
        wait_until(lambda: s.samples >= 5)
    finally:
        s.stop()
    assert s.skipped >= 5 * 3
    assert min(s.gaps) >= 0.045  # never two samples back to back to catch up


def recorder(note):
    """``(collect, taken, ready)``: a collect that appends ``note()`` to ``taken`` at each sample and sets ``ready``."""
    taken, ready = [], threading.Event()

    def collect(now_ns):
        taken.append(note())
        ready.set()
        return []

    return collect, taken, ready


def test_sample_on_wake_takes_the_extra_sample_on_the_waking_thread():
    collect, threads, ready = recorder(threading.current_thread)
    s = Sampler(collect, sink=None, interval=30.0, sample_on_wake=True)
    s.wake()  # not sampling yet: nothing to do
    assert threads == []
    s.start()
    try:
        assert ready.wait(10)
        s.wake()
        s.wake()  # one extra per interval, however many wakes
        s.wake(urgent=True)  # but an urgent one (a worker arriving or leaving waits for it)
        assert threads[1:] == [threading.current_thread()] * 2 and s.extra == 2
        assert threads[0] is s._thread
    finally:
        s.stop()
    s.wake(urgent=True)
    assert len(threads) == 3, "no sample after stop"


def test_wake_takes_one_extra_sample_before_the_next_tick():
    _time = time
    collect, taken, ready = recorder(_time.monotonic)
    s = Sampler(collect, sink=None, interval=30.0)
    s.start()
    try:
        assert ready.wait(10)
        s.wake()
        deadline = _time.monotonic() + 10
        while len(taken) < 2 and _time.monotonic() < deadline:
            _time.sleep(0.01)
        s.wake()
        s.wake()
        _time.sleep(0.2)
        assert len(taken) == 2 and s.extra == 1  # one extra per interval, however many wakes
    finally:
        s.stop()


def test_dag_tag_false_moves_dag_to_a_field_on_every_point():
    def collect(now_ns):
        return [
            Point("gpu", {**TAGS, "index": "0"}, {"utilization_gpu": 1.0}, now_ns),
            Point("task", {**TAGS, "prefix": "inc", "state": "memory"}, {"duration": 0.5}, now_ns - 1),
        ]

    s = Sampler(collect, None, field_tags=("dag",))
    points = {p.measurement: p for p in s.sample()}
    for p in points.values():
        assert "dag" not in p.tags and p.fields["dag"] == "2" and p.tags["job"] == "1"
    assert points["task"].tags["prefix"] == "inc"
