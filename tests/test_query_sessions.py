"""One database, two sessions with different tracking lists and both kinds of custom metric:
every reader (InfluxQL on a real influxd, Flux on a fake 2.x computing from the same points, the
spool) answers each session alone, and alike; with no options it reads the latest and says so
(issue 45), ``session=`` reaches the other, and a DAG row never mixes sessions."""

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
SESSIONS = {"a": "20240501T120000-000001-a1b2c3", "b": "20240502T120000-000002-d4e5f6"}


def _tagged(points: list[Point], session: str) -> list[Point]:
    return [p._replace(tags={**p.tags, "session": session}) for p in points]


def _dags(t0: int, jobs) -> list[Point]:
    out = []
    for j in jobs:
        tags, dag = {"host": "sched", "job": str(j)}, {"dag": str(j)}
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
    return _tagged(out + _dags(A0, [1, 2]), SESSIONS["a"])


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
    return _tagged(out + _dags(B0, [1]), SESSIONS["b"])


def _spool(root, name: str, points: list[Point]) -> None:
    for folder, keep in ((W1, W1), (W2, W2), (W3, W3), ("scheduler", None)):
        mine = [p for p in points if p.tags.get("worker") == keep and (keep or p.measurement == "dag")]
        if mine:
            path = root / name / folder.replace(":", "_").replace("/", "_")
            path.mkdir(parents=True)
            (path / "spool-1-000000.lp").write_bytes(b"\n".join(lineprotocol.encode_many(mine)) + b"\n")


def _sources(influxd, tmp_path_factory, name: str, a: list[Point], b: list[Point]):
    """The points of sessions a and b in a fresh database, a fake 2.x and a spool root (a folder each)."""
    pytest.importorskip("influxdb_client")
    from fake_influx2 import FakeInflux
    from flux_points import answer_from

    db = influxd.create_database(name)
    influxd.write(b"\n".join(lineprotocol.encode_many(a + b)), db=db)
    root = tmp_path_factory.mktemp(name)
    _spool(root, SESSIONS["a"], a)
    _spool(root, SESSIONS["b"], b)
    fake = FakeInflux()
    fake.answer = answer_from(a + b)
    return fake, {"url": influxd.url, "db": db, "spool": root, "flux": fake.url}


@pytest.fixture(scope="module")
def two_sessions(influxd, tmp_path_factory):
    fake, sources = _sources(influxd, tmp_path_factory, "two_sessions", session_a(), session_b())
    yield sources
    fake.stop()


def _untagged(points: list[Point]) -> list[Point]:
    return [p._replace(tags={k: v for k, v in p.tags.items() if k != "session"}) for p in points]


def _as_field(points: list[Point]) -> list[Point]:
    return [lineprotocol.tags_as_fields(p, ("session",)) for p in points]


@pytest.fixture(scope="module")
def untagged(influxd, tmp_path_factory):
    """The same two sessions as written before sessions were tagged."""
    fake, sources = _sources(influxd, tmp_path_factory, "untagged", _untagged(session_a()), _untagged(session_b()))
    yield sources
    fake.stop()


@pytest.fixture(scope="module")
def session_fields(influxd, tmp_path_factory):
    """The same two sessions written with session-tag: false (the id a field)."""
    fake, sources = _sources(
        influxd, tmp_path_factory, "session_fields", _as_field(session_a()), _as_field(session_b())
    )
    yield sources
    fake.stop()


WINDOWS = {"a": (A0, B0 - 1), "b": (B0, B0 + DAY)}


def _connect(two_sessions, kind: str, **options) -> query.Store:
    if kind == "spool":
        return query.connect(two_sessions["spool"], **options)
    if kind == "flux":
        return query.connect(two_sessions["flux"], "dask_metrics", language="flux", timeout=5, **options)
    return query.connect(two_sessions["url"], two_sessions["db"], **options)


def _open(two_sessions, kind: str, session: str) -> query.Store:
    """One session by its time range (as before sessions were tagged): the same answers as by its id."""
    start, stop = (t / 1e9 for t in WINDOWS[session])
    return _connect(two_sessions, kind, start=start, stop=stop)


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
        tables = query.worker_tables(a)
        t = tables[W2]
        assert list(t["queue"]) == [10.0, 11.0, 12.0, 13.0]  # per worker: its own column, not null
        assert list(t["dev-x[0]"]) == [1.0, 2.0, 3.0, 4.0] and list(t["dev-x[1]"]) == [101.0, 102.0, 103.0, 104.0]
        assert "dev-x" not in t.columns and "queue[0]" not in t.columns
        assert list(t["compute-util[1]"]) == [2.0, 12.0, 22.0, 32.0] and list(t["tasks"]) == [0, 1, 2, 3]
        assert query.get_peaks(a, "queue") == [{1: [1], 2: [3]}, {1: [11], 2: [13]}]
        assert query.get_peaks(a, "dev-x", per_job=False) == [[3, 103], [4, 104]]
        for metric in ("queue", "dev-x"):
            pd.testing.assert_frame_equal(
                query.peaks(a, metric, server=True), query.peaks(a, metric, server=False), check_dtype=False
            )


@pytest.mark.parametrize("kind", KINDS)
def test_a_per_worker_custom_metric_alone(two_sessions, kind):
    with _open(two_sessions, kind, "b") as b:
        tables = query.worker_tables(b, metrics=["queue"])
        assert [list(t["queue"]) for t in tables.values()] == [[100.0, 101.0, 102.0]] * 2
        assert query.get_peaks(b, "queue", per_job=False) == [[102], [102]]
        # W3 has mem-util but no power: one of two asked fields without values (the NaN count)
        t = query.worker_tables(b, metrics=["mem-util", "power"])[W3]
        assert list(t["mem-util[1]"]) == [1.0, 2.0, 3.0] and not any(c.startswith("power") for c in t.columns)


@pytest.mark.parametrize("kind", KINDS)
def test_export_and_peaks_from_csv_per_session(two_sessions, kind, tmp_path):
    with _open(two_sessions, kind, "a") as a, _open(two_sessions, kind, "b") as b:
        for name, db in (("a", a), ("b", b)):
            paths = query.to_csv(db, tmp_path / name)
            assert len(paths) == 3  # two workers and workers.csv
            for metric in ("queue", "tasks"):
                assert Monitor.peaks_from_csv(tmp_path / name, metric) == query.get_peaks(db, metric)
        assert Monitor.peaks_from_csv(tmp_path / "a", "dev-x", per_job=False) == [[3, 103], [4, 104]]


def test_the_readers_agree(two_sessions):
    for session in ("a", "b"):
        stores = {kind: _open(two_sessions, kind, session) for kind in KINDS}
        tables = {kind: query.worker_tables(db) for kind, db in stores.items()}
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
            query.worker_tables(b, metrics=["compute-util"])


@pytest.mark.parametrize("kind", KINDS)
def test_no_options_read_the_latest_session_and_say_so(two_sessions, kind):
    with _connect(two_sessions, kind) as db:
        assert db.workers() == [W2, W3] and db.jobs() == [1]
        dags = db.dags()
        assert list(dags["dag"]) == [1] and set(dags["session"]) == {SESSIONS["b"]}
        assert dags["submitted"].iloc[0].value == B0 + 1 and dags["ended"].iloc[0].value == B0 + 3 * 10**9 + 1
        assert db.metrics() == ["mem-util", "tasks", "power", "queue"]
        note = [n for n in db.notes if "session" in n]
        assert len(note) == 1 and f"read session {SESSIONS['b']!r}, the latest of 2" in note[0]
        assert SESSIONS["a"] in note[0] and "session=" in note[0]
        assert f"session {SESSIONS['b']!r}" in db.scope() or kind == "spool"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", [SESSIONS["a"], 2, "2"])
def test_session_reaches_the_other(two_sessions, kind, which):
    with _connect(two_sessions, kind, session=which) as db, _open(two_sessions, kind, "a") as by_time:
        assert db.workers() == [W1, W2] and db.jobs() == [1, 2]
        assert list(db.dags()["dag"]) == [1, 2] and set(db.dags()["session"]) == {SESSIONS["a"]}
        for worker, table in query.worker_tables(
            db
        ).items():  # timestamp: from the first sample, not the window's start
            other = query.worker_tables(by_time)[worker]
            pd.testing.assert_frame_equal(table.drop(columns="timestamp"), other.drop(columns="timestamp"))
        assert query.get_peaks(db, "queue") == query.get_peaks(by_time, "queue")


@pytest.mark.parametrize("kind", KINDS)
def test_all_sessions_and_a_dag_row_never_mixes_them(two_sessions, kind):
    with _connect(two_sessions, kind, session="all") as db:
        assert db.workers() == [W1, W2, W3] and db.jobs() == [1, 2]
        dags = db.dags()
        assert list(zip(dags["session"], dags["dag"])) == [(SESSIONS["a"], 1), (SESSIONS["a"], 2), (SESSIONS["b"], 1)]
        for start, row in zip((A0, A0, B0), dags.itertuples()):  # each DAG's submit and end from its own session
            assert start < row.submitted.value < row.ended.value < start + DAY
        assert list(db.dags(job=1)["session"]) == [SESSIONS["a"], SESSIONS["b"]]
        assert any("read all 2 sessions" in n for n in db.notes)


@pytest.mark.parametrize("kind", KINDS)
def test_sessions_lists_them_newest_first(two_sessions, kind):
    with _connect(two_sessions, kind) as db:
        listing = db.sessions()
    assert list(listing.columns) == ["index", "session", "start", "end", "workers", "jobs", "hosts"]
    assert listing[["index", "session", "workers", "jobs"]].values.tolist() == [
        [1, SESSIONS["b"], 2, 1],
        [2, SESSIONS["a"], 2, 2],
    ]
    assert [t.value for t in listing["start"]] == [B0 + 2000, A0 + 1000]  # the ids' microseconds
    assert [t.value for t in listing["end"]] == [B0 + 3 * 10**9 + 1, A0 + 3 * 10**9 + 2]
    assert list(listing["hosts"]) == [2, 2]  # n2 (or n1) and the scheduler's


@pytest.mark.parametrize("kind", KINDS)
def test_an_unknown_session(two_sessions, kind):
    if kind == "spool":
        with pytest.raises(query.QueryError, match=r"session 'nope' not in .*sessions: \['2024"):
            _connect(two_sessions, kind, session="nope")
    else:  # no question is asked for a named session: reading says what is there
        with _connect(two_sessions, kind, session="nope") as db:
            with pytest.raises(query.QueryError, match=r"session 'nope'.*sessions \(newest first\) \['2024050"):
                query.worker_tables(db)
    with pytest.raises(query.QueryError, match=r"no session 3 in .*2 session\(s\), 1 = the latest"):
        _connect(two_sessions, kind, session=3)


@pytest.mark.parametrize("kind", ["influxql", "flux"])
def test_points_without_a_session_are_one_unnamed_session_and_its_dags_do_not_mix(untagged, kind):
    with _connect(untagged, kind) as db:
        assert db.workers() == [W1, W2, W3] and db.jobs() == [1, 2]
        assert any("carry no session id" in n and "'unnamed'" in n and "start=/stop=" in n for n in db.notes)
        dags = db.dags()  # DAG 1 twice (two runs): each end pairs with the submit before it
        assert list(zip(dags["session"], dags["dag"])) == [("unnamed", 1), ("unnamed", 2), ("unnamed", 1)]
        for start, row in zip((A0, A0, B0), dags.itertuples()):
            assert start < row.submitted.value < row.ended.value < start + DAY
        assert db.sessions()[["index", "session", "workers", "jobs"]].values.tolist() == [[1, "unnamed", 3, 2]]
    with _connect(untagged, kind, session="unnamed") as db:
        assert db.workers() == [W1, W2, W3]


def test_a_tagged_session_after_untagged_points_is_the_latest(influxd):
    db = influxd.create_database("mixed_sessions")
    influxd.write(b"\n".join(lineprotocol.encode_many(_untagged(session_a()) + session_b())), db=db)
    with query.connect(influxd.url, db) as store:
        assert store.workers() == [W2, W3] and any("the latest of 2" in n and "'unnamed'" in n for n in store.notes)
    with query.connect(influxd.url, db, session="unnamed") as store:
        assert store.workers() == [W1, W2] and list(store.dags()["dag"]) == [1, 2]
        assert "session 'unnamed'" in store.scope()


@pytest.mark.parametrize("kind", KINDS)
def test_a_session_written_as_a_field(session_fields, kind):
    with _connect(session_fields, kind) as db:
        assert db.workers() == [W2, W3] and db.jobs() == [1] and list(db.dags()["dag"]) == [1]
        assert db.metrics() == ["mem-util", "tasks", "power", "queue"]  # the session field is no metric
        assert any(f"read session {SESSIONS['b']!r}, the latest of 2" in n for n in db.notes)
        assert db.sessions()[["index", "session", "workers", "jobs"]].values.tolist() == [
            [1, SESSIONS["b"], 2, 1],
            [2, SESSIONS["a"], 2, 2],
        ]
    with _connect(session_fields, kind, session=SESSIONS["a"]) as db:
        assert db.workers() == [W1, W2] and db.jobs() == [1, 2]
        assert kind != "flux" or any("Flux reads it by its time range" in n for n in db.notes)
