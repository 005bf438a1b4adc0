import pytest

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
