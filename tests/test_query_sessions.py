"""One database, two sessions with different tracking lists and both kinds of custom metric:
every reader (InfluxQL on a real influxd, Flux on a fake 2.x computing from the same points, the
spool) answers each session alone, and alike."""

from __future__ import annotations

import pandas as pd
import pytest

from dask_influx_metrics import lineprotocol, query
from dask_influx_metrics.client.monitor import Monitor
from dask_influx_metrics.schema import Point

DAY = 86_400 * 10**9
A0 = 1_714_564_800_000_000_000  # 2024-05-01T12:00:00Z
B0 = A0 + DAY
W1, W2, W3 = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1", "tcp://10.0.0.3:1"
SESSIONS = {"a": "20240501T120000-000001", "b": "20240502T120000-000002"}


def _dags(t0: int, jobs) -> list[Point]:
    out = []
    for j in jobs:
        tags, dag = {"job": str(j)}, {"dag": str(j)}
        out.append(
            Point("dag", tags, {**dag, "status": "running", "event": "submit", "tasks": 2, "label": "x"}, t0 + j)
        )
        out.append(Point("dag", tags, {**dag, "status": "ok", "event": "end", "duration": 1.0}, t0 + 3 * 10**9 + j))
    return out


def session_a() -> list[Point]:
    """compute-util, total-mem, host-cpu, tasks; custom ``dev-x`` per GPU and ``queue`` per worker."""
    out = []
    for w, worker in enumerate([W1, W2]):
        for k in range(4):
            t, job = A0 + 10**9 + k * 500_000_000 + w, "1" if k < 2 else "2"
            tags = {"host": "n1", "worker": worker, "job": job, "dag": job}
            for g in (0, 1):
                dev = {**tags, "index": str(g), "uuid": f"GPU-{w}{g}", "name": "Sim"}
                out.append(Point("gpu", dev, {"utilization_gpu": float(10 * k + g + w), "memory_used": 1000.0 + k}, t))
                out.append(Point("custom", dev, {"dev-x": float(100 * g + k + w)}, t))
            out.append(Point("custom", tags, {"queue": float(k + 10 * w)}, t))
            out.append(Point("host", tags, {"cpu_percent": 5.0 * k}, t))
            out.append(Point("worker", tags, {"tasks": k}, t))
    return out + _dags(A0, [1, 2])


def session_b() -> list[Point]:
    """mem-util, power (not on W3), tasks; custom ``queue`` per worker only; other workers, job 1 only."""
    out = []
    for w, worker in enumerate([W2, W3]):
        for k in range(3):
            t = B0 + 10**9 + k * 500_000_000 + w
            tags = {"host": "n2", "worker": worker, "job": "1", "dag": "1"}
            for g in (0, 1):
                fields = {"memory_used_percent": float(k + g), **({"power_draw": 50.0 + k} if w == 0 else {})}
                out.append(Point("gpu", {**tags, "index": str(g), "uuid": f"G{w}{g}", "name": "Sim"}, fields, t))
            out.append(Point("custom", tags, {"queue": float(100 + k)}, t))
            out.append(Point("worker", tags, {"tasks": 1}, t))
    return out + _dags(B0, [1])


def _spool(root, name: str, points: list[Point]) -> None:
    for folder, keep in ((W1, W1), (W2, W2), (W3, W3), ("scheduler", None)):
        mine = [p for p in points if p.tags.get("worker") == keep and (keep or p.measurement == "dag")]
        if mine:
            path = root / name / folder.replace(":", "_").replace("/", "_")
            path.mkdir(parents=True)
            (path / "spool-1-000000.lp").write_bytes(b"\n".join(lineprotocol.encode_many(mine)) + b"\n")


@pytest.fixture(scope="module")
def two_sessions(influxd, tmp_path_factory):
    pytest.importorskip("influxdb_client")
    from fake_influx2 import FakeInflux
    from flux_points import answer_from

    db = influxd.create_database("two_sessions")
    points = session_a() + session_b()
    influxd.write(b"\n".join(lineprotocol.encode_many(points)), db=db)
    root = tmp_path_factory.mktemp("spools")
    _spool(root, SESSIONS["a"], session_a())
    _spool(root, SESSIONS["b"], session_b())
    fake = FakeInflux()
    fake.answer = answer_from(points)
    yield {"url": influxd.url, "db": db, "spool": root, "flux": fake.url}
    fake.stop()


WINDOWS = {"a": (A0, B0 - 1), "b": (B0, B0 + DAY)}


def _open(two_sessions, kind: str, session: str) -> query.Store:
    start, stop = (t / 1e9 for t in WINDOWS[session])
    if kind == "spool":
        return query.connect(two_sessions["spool"], session=SESSIONS[session], start=start, stop=stop)
    if kind == "flux":
        return query.connect(two_sessions["flux"], "dask_metrics", language="flux", start=start, stop=stop, timeout=5)
    return query.connect(two_sessions["url"], two_sessions["db"], start=start, stop=stop)


KINDS = ["influxql", "flux", "spool"]


@pytest.mark.parametrize("kind", KINDS)
def test_what_each_session_holds(two_sessions, kind):
    with _open(two_sessions, kind, "a") as a, _open(two_sessions, kind, "b") as b:
        assert a.metrics() == ["total-mem", "compute-util", "tasks", "host-cpu", "dev-x", "queue"]
        assert b.metrics() == ["mem-util", "tasks", "power", "queue"]
        assert a.workers() == [W1, W2] and b.workers() == [W2, W3]
        assert a.jobs() == [1, 2] and b.jobs() == [1]
        assert list(a.dags()["dag"]) == [1, 2] and list(b.dags()["dag"]) == [1]


@pytest.mark.parametrize("kind", KINDS)
def test_tables_of_both_kinds_of_custom_metric(two_sessions, kind):
    with _open(two_sessions, kind, "a") as a:
        tables = a.worker_tables()
        t = tables[W2]
        assert list(t["queue"]) == [10.0, 11.0, 12.0, 13.0]  # per worker: its own column, not null
        assert list(t["dev-x[0]"]) == [1.0, 2.0, 3.0, 4.0] and list(t["dev-x[1]"]) == [101.0, 102.0, 103.0, 104.0]
        assert "dev-x" not in t.columns and "queue[0]" not in t.columns
        assert list(t["compute-util[1]"]) == [2.0, 12.0, 22.0, 32.0] and list(t["tasks"]) == [0, 1, 2, 3]
        assert a.get_peaks("queue") == [{1: [1], 2: [3]}, {1: [11], 2: [13]}]
        assert a.get_peaks("dev-x", per_job=False) == [[3, 103], [4, 104]]
        for metric in ("queue", "dev-x"):
            pd.testing.assert_frame_equal(
                a.peaks(metric, server=True), a.peaks(metric, server=False), check_dtype=False
            )


@pytest.mark.parametrize("kind", KINDS)
def test_a_per_worker_custom_metric_alone(two_sessions, kind):
    with _open(two_sessions, kind, "b") as b:
        tables = b.worker_tables(metrics=["queue"])
        assert [list(t["queue"]) for t in tables.values()] == [[100.0, 101.0, 102.0]] * 2
        assert b.get_peaks("queue", per_job=False) == [[102], [102]]
        # W3 has mem-util but no power: one of two asked fields without values (the NaN count)
        t = b.worker_tables(metrics=["mem-util", "power"])[W3]
        assert list(t["mem-util[1]"]) == [1.0, 2.0, 3.0] and not any(c.startswith("power") for c in t.columns)


@pytest.mark.parametrize("kind", KINDS)
def test_export_and_peaks_from_csv_per_session(two_sessions, kind, tmp_path):
    with _open(two_sessions, kind, "a") as a, _open(two_sessions, kind, "b") as b:
        for name, db in (("a", a), ("b", b)):
            paths = db.to_csv(tmp_path / name)
            assert len(paths) == 3  # two workers and workers.csv
            for metric in ("queue", "tasks"):
                assert Monitor.peaks_from_csv(tmp_path / name, metric) == db.get_peaks(metric)
        assert Monitor.peaks_from_csv(tmp_path / "a", "dev-x", per_job=False) == [[3, 103], [4, 104]]


def test_the_readers_agree(two_sessions):
    for session in ("a", "b"):
        stores = {kind: _open(two_sessions, kind, session) for kind in KINDS}
        tables = {kind: db.worker_tables() for kind, db in stores.items()}
        for kind in ("flux", "spool"):
            assert list(tables[kind]) == list(tables["influxql"])
            for worker, t in tables["influxql"].items():
                pd.testing.assert_frame_equal(tables[kind][worker], t, check_dtype=False)
        for db in stores.values():
            db.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_metric_of_the_other_session(two_sessions, kind):
    with _open(two_sessions, kind, "b") as b:
        with pytest.raises(
            ValueError,
            match=r"metric\(s\) \['compute-util'\] were not collected; present: "
            r"\['mem-util', 'tasks', 'power', 'queue'\] \(in ",
        ):
            b.worker_tables(metrics=["compute-util"])
