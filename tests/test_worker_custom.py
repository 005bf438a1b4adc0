import logging
import threading
import time

import pytest

from dask_influx_metrics.names import CUSTOM_METRIC
from dask_influx_metrics.notices import Reporter
from dask_influx_metrics.sampling.sampler import Sampler
from dask_influx_metrics.schema import Point
from dask_influx_metrics.worker.custom import CustomSource, custom_metric, validate


def _into(reports):
    """A worker's ``Reporter`` whose session events (metric name, message) land in ``reports``."""

    def send(event):
        assert event["what"] == CUSTOM_METRIC and event["problem"] in ("failed", "overran")
        reports.append((event["metric"], event["message"]))

    return Reporter(send, worker="tcp://w:1")


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


@pytest.mark.parametrize(
    "name, message",
    [
        # issue 23 item 4: reads returned the built-in's values, every all-metric read crashed
        ("compute-util", "'compute-util' is a built-in metric name"),
        ("tasks", "built-in metric name"),
        ("host.memory_used", "field 'host.memory_used' of the 'host' measurement"),
        ("custom.x", "'custom' measurement"),
        ("timestamp", "column of every table"),
        ("br[0]", r"per-GPU column \('name\[0\]'\)"),
        ("new\nline", r"control character\(s\) '\\n'"),
        ("back\\slash", "backslash"),
        (" padded", "leading or trailing spaces"),
        ("uuid", "tag name of the custom measurement"),
    ],
)
def test_names_that_do_not_read_back_as_the_metric_are_refused(name, message):
    with pytest.raises(ValueError, match=message):
        custom_metric(name)
    sneaky = custom_metric("fine")(lambda w, h: 1)
    sneaky.name = name  # renamed after decoration: attach's validate() checks again
    with pytest.raises(ValueError, match=message):
        validate([sneaky])


def test_names_that_read_back_are_accepted():
    for name in ("ready-queue", "gpu_fans", "br[x]", "ünï code", "a.b", "x[0] y"):
        assert custom_metric(name)(lambda w, h: 1).name == name


def test_a_signature_that_fits_neither_form_is_refused_showing_both():
    # issue 24 item 4: this failed on every worker at run time, then readers called the metric "unknown"
    def ready_queue(worker):
        return 1

    with pytest.raises(
        TypeError,
        match=r"'ready-queue' is per_device=True \(the default\), so it is called as "
        r"fn\(worker, handle\) once per GPU, but ready_queue\(worker\) cannot take that; the "
        r"accepted forms: .*fn\(worker, handle\).*per_device=False\) calls fn\(worker\) once",
    ):
        custom_metric("ready-queue")(ready_queue)
    per_worker = custom_metric("ready-queue", per_device=False)(ready_queue)
    per_worker.per_device = True  # changed after decoration: attach's validate() checks again
    with pytest.raises(TypeError, match="per_device=True"):
        validate([per_worker])
    with pytest.raises(TypeError, match=r"per_device=False, so it is called as fn\(worker\) once per sample"):
        custom_metric("three", per_device=False)(lambda a, b, c: 1)


def test_per_worker_metrics_take_the_worker_alone_or_the_handles_too():
    alone = custom_metric("alone", per_device=False)(lambda worker: worker)
    both = custom_metric("both", per_device=False)(lambda worker, handles: len(handles))
    devices = [({"index": "0"}, "h0"), ({"index": "1"}, "h1")]
    src = CustomSource([alone, both], 7, lambda: devices)
    try:
        (reading,) = src.read()
    finally:
        src.stop()
    assert reading.fields == {"alone": 7.0, "both": 2.0}


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


def test_a_failing_metric_is_reported_once_and_others_carry_on(caplog):
    """Once: one session event and one log line (its own once-set and the worker's Reporter said it twice)."""
    reports = []
    bad = custom_metric("broken", per_device=False)(lambda w, hs: 1 / 0)
    good = custom_metric("fine", per_device=False)(lambda w, hs: 5)
    src = CustomSource([bad, good], None, lambda: [], report=_into(reports))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert [r.fields for r in src.read()] == [{"fine": 5.0}]
    assert len(reports) == 1 and reports[0][0] == "broken" and "ZeroDivisionError" in reports[0][1]
    said = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert said == [f"influx-metrics on tcp://w:1: {reports[0][1]}"]


def test_non_numeric_result_counts_as_failure():
    reports = []
    odd = custom_metric("text", per_device=False)(lambda w, hs: "hello")
    assert CustomSource([odd], None, lambda: [], report=_into(reports)).read() == []
    assert [n for n, _ in reports] == ["text"]


def test_a_huge_value_or_error_is_quoted_in_at_most_about_200_characters():
    """Issue 43 item 6: a custom metric returning a 100 kB string (or raising with one) was repeated whole."""
    reports = []
    huge = custom_metric("huge", per_device=False)(lambda w, hs: "x" * 100_000)

    def raising(w, hs):
        raise ValueError("y" * 100_000)

    loud = custom_metric("loud", per_device=False)(raising)
    src = CustomSource([huge, loud], None, lambda: [], report=_into(reports))
    try:
        assert src.read() == []
    finally:
        src.stop()
    said = dict(reports)
    assert len(said["huge"]) < 400 and "100002 characters" in said["huge"] and "not a number" in said["huge"]
    assert len(said["loud"]) < 400 and "100000 characters" in said["loud"]


def test_bools_and_numeric_text_are_rejected_and_reported_once():
    reports = []
    flag = custom_metric("flag", per_device=False)(lambda w, hs: True)
    text = custom_metric("text-seven", per_device=False)(lambda w, hs: " 7 ")
    fine = custom_metric("fine", per_device=False)(lambda w, hs: 7)
    src = CustomSource([flag, text, fine], None, lambda: [], report=_into(reports))
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
    src = CustomSource([slow, fast], None, lambda: [], report=_into(reports), timeout=0.05)
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
            sampler = Sampler(
                lambda now_ns, src=src: [Point("custom", {}, r.fields, now_ns) for r in src.read()], None, interval=0.01
            )
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
