import statistics
import threading
import time

import pytest

from dask_influx_metrics.worker.sampler import Sampler
from dask_influx_metrics.schema import Point, Reading

TAGS = {"host": "h", "worker": "w", "job": "1", "dag": "2"}


class ListSink:
    def __init__(self):
        self.lines, self.lock = [], threading.Lock()

    def send(self, lines):
        with self.lock:
            self.lines.extend(lines)

    def close(self):
        pass


class Static:
    def __init__(self, *readings):
        self.readings = list(readings)

    def read(self):
        return self.readings


class Broken:
    calls = 0

    def read(self):
        Broken.calls += 1
        raise RuntimeError("sensor on fire")


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        threading.Event().wait(0.01)


def test_readings_with_the_same_series_merge_into_one_point_with_common_tags():
    s = Sampler([Static(Reading("worker", {}, {"tasks": 1})), Static(Reading("worker", {}, {"rss": 5}),
                 Reading("gpu", {"index": "0"}, {"utilization_gpu": 1.0}))], ListSink(), lambda: TAGS)
    points = {p.measurement: p for p in s.sample()}
    assert points["worker"].fields == {"tasks": 1, "rss": 5}
    assert points["gpu"].tags == {**TAGS, "index": "0"}
    assert len({p.time_ns for p in points.values()}) == 1


def test_clock_offset_moves_timestamps():
    s = Sampler([Static(Reading("host", {}, {"cpu_percent": 1.0}))], None, lambda: TAGS, clock_offset=lambda: 100.0)
    [p] = s.sample()
    assert p.time_ns / 1e9 - time.time() == pytest.approx(100.0, abs=1.0)


def test_thread_samples_on_schedule_and_a_broken_source_does_not_stop_it(caplog):
    sink = ListSink()
    s = Sampler([Broken(), Static(Reading("host", {}, {"cpu_percent": 1.0}))], sink, lambda: TAGS, interval=0.02)
    s.start()
    try:
        wait_until(lambda: s.samples >= 15)
    finally:
        s.stop()
    assert not s.running
    assert len(sink.lines) >= 15 and all(line.startswith(b"host,") for line in sink.lines)
    assert statistics.median(s.gaps) == pytest.approx(0.02, abs=0.01)
    assert sum("sensor on fire" in r.getMessage() for r in caplog.records) == 1


def test_slow_samples_skip_ticks_instead_of_bursting():
    class Slow:
        def read(self):
            threading.Event().wait(0.05)  # the source itself is slow (simulated work)
            return []

    s = Sampler([Slow()], ListSink(), lambda: TAGS, interval=0.01)
    s.start()
    try:
        wait_until(lambda: s.samples >= 5)
    finally:
        s.stop()
    assert s.skipped >= 5 * 3
    assert min(s.gaps) >= 0.045  # never two samples back to back to catch up


def test_wake_takes_one_extra_sample_before_the_next_tick():
    _time = time
    taken = []
    ready = threading.Event()

    def before():
        taken.append(_time.monotonic())
        ready.set()

    s = Sampler([], sink=None, tags=dict, interval=30.0, before_sample=before)
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


def test_dag_tag_false_moves_dag_to_a_field_on_samples_and_on_stream_points_alike():
    class Stream:
        def points(self, now_ns):
            return [Point("task", {**TAGS, "prefix": "inc", "state": "memory"}, {"duration": 0.5}, now_ns - 1)]

    s = Sampler([Static(Reading("gpu", {"index": "0"}, {"utilization_gpu": 1.0}))], None, lambda: TAGS,
                streams=(Stream(),), field_tags=("dag",))
    points = {p.measurement: p for p in s.sample()}
    for p in points.values():
        assert "dag" not in p.tags and p.fields["dag"] == "2" and p.tags["job"] == "1"
    assert points["task"].tags["prefix"] == "inc"
