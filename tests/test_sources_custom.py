import threading
import time

import pytest

from dask_influx_metrics.sampler import Sampler
from dask_influx_metrics.schema import Point
from dask_influx_metrics.worker.sources.custom import CustomSource, custom_metric, validate


def test_undecorated_function_is_refused_by_name():
    def power(worker, handle):
        return 1

    with pytest.raises(TypeError, match="power.*not decorated"):
        validate([power])


def test_duplicate_names_and_bad_names_are_refused():
    a = custom_metric("x")(lambda w, h: 1)
    b = custom_metric("x")(lambda w, h: 2)
    with pytest.raises(ValueError, match="'x'"):
        validate([a, b])
    with pytest.raises(ValueError, match="non-empty"):
        custom_metric("")


def test_per_device_and_per_worker_values_with_device_tags():
    per_dev = custom_metric("double-index", per_device=True)(lambda w, h: h * 2)
    total = custom_metric("count", per_device=False)(lambda w, hs: len(hs))
    devices = [({"index": "0", "uuid": "u0"}, 0), ({"index": "1", "uuid": "u1"}, 1)]
    readings = CustomSource([per_dev, total], "worker", lambda: devices).read()
    got = {tuple(sorted(r.tags.items())): r.fields for r in readings}
    assert got == {
        (("index", "0"), ("uuid", "u0")): {"double-index": 0.0},
        (("index", "1"), ("uuid", "u1")): {"double-index": 2.0},
        (): {"count": 2.0},
    }


def test_a_failing_metric_is_reported_once_and_others_carry_on():
    reports = []
    bad = custom_metric("broken", per_device=False)(lambda w, hs: 1 / 0)
    good = custom_metric("fine", per_device=False)(lambda w, hs: 5)
    src = CustomSource([bad, good], None, lambda: [], report=lambda name, msg: reports.append((name, msg)))
    for _ in range(3):
        assert [r.fields for r in src.read()] == [{"fine": 5.0}]
    assert len(reports) == 1 and reports[0][0] == "broken" and "ZeroDivisionError" in reports[0][1]


def test_non_numeric_result_counts_as_failure():
    reports = []
    odd = custom_metric("text", per_device=False)(lambda w, hs: "hello")
    assert CustomSource([odd], None, lambda: [], report=lambda n, m: reports.append(n)).read() == []
    assert reports == ["text"]


def test_bools_and_numeric_text_are_rejected_and_reported_once():
    reports = []
    flag = custom_metric("flag", per_device=False)(lambda w, hs: True)
    text = custom_metric("text-seven", per_device=False)(lambda w, hs: " 7 ")
    fine = custom_metric("fine", per_device=False)(lambda w, hs: 7)
    src = CustomSource([flag, text, fine], None, lambda: [], report=lambda n, m: reports.append((n, m)))
    try:
        for _ in range(3):
            assert [r.fields for r in src.read()] == [{"fine": 7.0}]
    finally:
        src.stop()
    assert sorted(n for n, _ in reports) == ["flag", "text-seven"]
    assert "bool" in dict(reports)["flag"] and "str" in dict(reports)["text-seven"]


def test_a_slow_metric_is_skipped_for_that_sample_reported_once_and_others_keep_their_pace():
    reports = []
    release = threading.Event()
    slow = custom_metric("slow", per_device=False)(lambda w, hs: release.wait(2.0) and 1)
    fast = custom_metric("fast", per_device=False)(lambda w, hs: 3)
    src = CustomSource([slow, fast], None, lambda: [], report=lambda n, m: reports.append((n, m)), timeout=0.05)
    try:
        started = time.monotonic()
        got = [src.read() for _ in range(10)]
        elapsed = time.monotonic() - started
    finally:
        release.set()
        src.stop()
    assert elapsed < 0.5  # one deadline (50 ms) at most, then the busy metric is skipped without waiting
    assert all([r.fields for r in readings] == [{"fast": 3.0}] for readings in got)
    assert [n for n, _ in reports] == ["slow"] and "longer than 0.05 s" in reports[0][1]


def test_a_hung_metric_never_blocks_stop_and_leaks_no_thread_per_cycle():
    hang = threading.Event()
    hung = custom_metric("hung", per_device=False)(lambda w, hs: hang.wait())
    worker = object()

    def threads():
        return sum(t.name == "influx-metrics-custom-hung" for t in threading.enumerate())

    try:
        for _ in range(5):
            src = CustomSource([hung], worker, lambda: [], timeout=0.01)
            sampler = Sampler(lambda now_ns, src=src: [Point("custom", {}, r.fields, now_ns) for r in src.read()],
                              None, interval=0.01)
            sampler.start()
            threading.Event().wait(0.05)
            started = time.monotonic()
            sampler.stop()
            src.stop()
            assert time.monotonic() - started < 0.5 and not sampler.running
            assert threads() == 1  # the one call still hung, not one per cycle
    finally:
        hang.set()
    deadline = time.monotonic() + 5
    while threads() and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert threads() == 0
