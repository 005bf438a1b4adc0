"""The Flux backend without a Flux server: its Flux passes the Flux language server, and the real
``influxdb-client`` talks to a fake InfluxDB 2.x that answers with hand-written annotated CSV.

The CSV below follows what InfluxDB 2.x sends (flux ``csv.ResultEncoder``): CRLF lines; a
``#datatype``/``#group``/``#default`` block and a header whose first cell is empty; every
dateTime column annotated ``dateTime:RFC3339`` but written RFC3339Nano; a blank line and a new
block whenever the next table's columns differ; values with commas or quotes CSV-quoted. What it
cannot show is whether a real server runs the Flux as intended (pushdowns, pivot merging).
"""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

pytest.importorskip("influxdb_client")

from fake_influx2 import ANSWERS, HOSTILE, JOBS, T0, FakeInflux, T, W, answer, crlf, points  # noqa: E402,F401

from dask_influx_metrics import lineprotocol, query  # noqa: E402
from dask_influx_metrics.client.query import QueryError, Store  # noqa: E402
from dask_influx_metrics.client.query import fluxtext as F
from dask_influx_metrics.client.query.fluxcsv import read_annotated_csv  # noqa: E402
from dask_influx_metrics.schema import ACCOUNTING, ACCOUNTING_FIELDS, MEASUREMENT_TAGS, Point

ACCOUNTING_BY = MEASUREMENT_TAGS[ACCOUNTING]


@pytest.fixture(scope="module")
def server():
    fake = FakeInflux()
    yield fake
    fake.stop()


@pytest.fixture
def fake(server):
    server.requests.clear()
    server.answer = answer
    return server


def _connect(fake, **kw) -> Store:
    return query.connect(
        fake.url,
        database=kw.pop("database", "dask_metrics"),
        language="flux",
        org="my-org",
        token="my-token",
        timeout=5,
        **kw,
    )


@pytest.fixture
def spool_store(tmp_path):
    for folder, keep in (
        ("tcp___10.0.0.1_1234", lambda p: p.measurement != "dag"),
        ("scheduler", lambda p: p.measurement == "dag"),
    ):
        path = tmp_path / SID / folder
        path.mkdir(parents=True)
        lines = lineprotocol.encode_many(p for p in points() if keep(p))
        (path / "spool-1-000000.lp").write_bytes(b"\n".join(lines) + b"\n")
    return query.connect(tmp_path)


SID = "20240501T120000-000001"  # a session of a version before the ids had random digits


# --- the Flux text -------------------------------------------------------------------
def _all_queries() -> dict[str, str]:
    out = {}
    for name, kw in {
        "plain": {},
        "window": {"start_ns": T0, "stop_ns": T[2]},
        "hostile": {"tags": HOSTILE, "start_ns": 0, "stop_ns": 2**62},
    }.items():
        out[f"fields-{name}"] = F.flux_fields_query('dask "metrics"/autogen', **kw)
        out[f"tags-{name}"] = F.flux_tag_values_query("b", "job", **kw)
        out[f"tags-odd-{name}"] = F.flux_tag_values_query("b", 'we"ird\\key', **kw)
        out[f"first-{name}"] = F.flux_first_time_query("b", **kw)
        out[f"dag-{name}"] = F.flux_dag_query("b", **kw)
        for m, fields in (
            ("gpu", ["utilization_gpu", "memory_used"]),
            ("host", ["cpu_percent"]),
            ("worker", ["tasks", "running"]),
            ("custom", ['my "metric"']),
        ):
            for job in (None, 2):
                out[f"frame-{m}-{job}-{name}"] = F.flux_frame_query("b", m, fields, 'tcp://h:1"\\${x}', job, **kw)
        for by, workers, job in (
            (["worker", "index", "job"], [W, 'w"2\\'], 3),
            (["worker"], None, None),
            (["worker", "index"], [W], None),
        ):
            out[f"max-{len(by)}-{job}-{name}"] = F.flux_max_query("b", "gpu", "memory_used", by, workers, job, **kw)
        out[f"max-busy-{name}"] = F.flux_max_query(
            "b", "gpu", "memory_used", ["worker", "index", "job"], [W], 2, busy=True, **kw
        )
        out[f"frame-dagfield-{name}"] = F.flux_frame_query("b", "gpu", ["utilization_gpu"], W, 2, **kw, dag_field=True)
        out[f"max-busy-dagfield-{name}"] = F.flux_max_query(
            "b", "gpu", 'my "metric"', ["worker", "job"], [W], 2, busy=True, dag_field=True, **kw
        )
        for last in (False, True):
            for field in (False, True):
                keys = ["session", "host", "worker", "job"]
                out[f"session-{last}-{field}-{name}"] = F.flux_session_query("b", keys, last=last, field=field, **kw)
        out[f"unnamed-{name}"] = F.flux_frame_query("b", "gpu", ["utilization_gpu"], W, tags={"session": ""})
        out[f"last-{name}"] = F.flux_last_query("b", "accounting", list(ACCOUNTING_FIELDS), list(ACCOUNTING_BY), **kw)
    out["buckets"] = F.BUCKETS_QUERY
    return out


def test_every_generated_query_passes_the_flux_language_server():
    fluxcheck = pytest.importorskip("fluxcheck")
    sources = _all_queries()
    assert fluxcheck.flux_diagnostics(sources) == {name: [] for name in sources}


def test_flux_text():
    frame = F.flux_frame_query("b", "gpu", ["utilization_gpu"], W, 2, {"run": "x"}, start_ns=T0, stop_ns=T[2])
    assert frame == (
        'from(bucket: "b")\n'
        f"    |> range(start: time(v: {T0}), stop: time(v: {T[2] + 1}))\n"  # Flux's stop is exclusive
        '    |> filter(fn: (r) => r._measurement == "gpu" and r._field == "utilization_gpu" and r["run"] == "x"'
        f' and r.worker == "{W}" and r.job =~ /(^|,)2(,|$)/)\n'
        '    |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        '    |> keep(columns: ["_time", "job", "dag", "index", "utilization_gpu"])\n'
    )
    assert "range(start: time(v: 0), stop: 1d)" in F.flux_first_time_query("b")
    assert F.flux_max_query("b", "host", "cpu_percent", ["worker", "job"], ["a", "b"]).endswith(
        '"cpu_percent" and (r.worker == "a" or r.worker == "b"))\n'
        '    |> group(columns: ["worker", "job"])\n    |> max()\n    |> keep(columns: ["worker", "job", "_value"])\n'
    )
    assert F.string('say "hi" \\ ${x} $y\n') == '"say \\"hi\\" \\\\ \\${x} $y\\n"'


# --- annotated CSV ---------------------------------------------------------------------
def test_read_annotated_csv_types():
    text = crlf("""
#datatype,string,long,dateTime:RFC3339,string,long,double,boolean,string
#group,false,false,false,true,false,false,false,false
#default,_result,,,,,,,
,result,table,_time,index,n,x,ok,s
,,0,2024-05-01T12:00:00.000000001Z,007,1,1.5,true,"a,""b"" c"
,,0,2024-05-01T12:00:00Z,1e3,,,false,
""")
    frame = read_annotated_csv(text)
    assert list(frame.columns) == ["_time", "index", "n", "x", "ok", "s"]
    assert frame["_time"].dtype == "int64" and list(frame["_time"]) == [T0, T0 - 1]
    assert list(frame["index"]) == ["007", "1e3"]  # tags that look like numbers stay strings
    assert frame["n"].iloc[0] == 1 and pd.isna(frame["n"].iloc[1]) and pd.isna(frame["x"].iloc[1])
    assert list(frame["ok"]) == [True, False] and frame["s"].iloc[0] == 'a,"b" c' and pd.isna(frame["s"].iloc[1])
    assert read_annotated_csv("").empty and read_annotated_csv("\r\n").empty


@pytest.mark.parametrize(
    "text",
    [
        "error,reference\r\nfailed to read: boom,\r\n",  # InfluxDB 2.x: the error after the tables it sent
        crlf("#datatype,string,string\n#group,true,true\n#default,,\n,error,reference\n,failed to read: boom,"),
    ],
)
def test_error_table_raises(text):
    with pytest.raises(QueryError, match=r"failed to read: boom\nmy query"):
        read_annotated_csv(ANSWERS["host"].rstrip("\r\n") + "\r\n\r\n" + text, "my query")


# --- through influxdb-client and the fake server -------------------------------------
def test_requests_the_client_sends(fake):
    db = _connect(fake, tags={"run": "r1"}, start=pd.Timestamp(T0, unit="ns", tz="UTC"))
    backend = db.backend
    frame = backend.frame("gpu", ["utilization_gpu", "memory_used"], W, job=2)
    assert {r["path"] for r in fake.requests} == {"/api/v2/query"}
    assert {r["method"] for r in fake.requests} == {"POST"}
    request = fake.requests[-1]
    assert request["params"] == {"org": "my-org"}
    assert request["headers"]["Authorization"] == "Token my-token"
    assert request["body"]["dialect"]["annotations"] == ["datatype", "group", "default"]
    assert request["body"]["dialect"]["dateTimeFormat"] == "RFC3339Nano"
    # the session: its tag, then (the canned points have none) a session field; then the frame (only points
    # without a session id: all of them, as before sessions were tagged)
    window = {"tags": {"run": "r1"}, "start_ns": T0, "stop_ns": None}
    assert fake.queries() == [
        F.BUCKETS_QUERY,
        F.flux_session_query("dask_metrics", ["session"], **window),
        F.flux_session_query("dask_metrics", ["session"], field=True, **window),
        F.flux_frame_query("dask_metrics", "gpu", ["utilization_gpu", "memory_used"], W, 2, {"run": "r1"}, start_ns=T0),
    ]
    assert any("carry no session id" in n for n in db.notes)
    assert len(frame) == 6


def test_frame_shapes(fake):
    backend = _connect(fake).backend
    gpu = backend.frame("gpu", ["utilization_gpu", "memory_used"], W)
    assert list(gpu.columns) == ["time", "job", "dag", "index", "utilization_gpu", "memory_used"]
    assert gpu["time"].dtype == "int64" and list(gpu["time"]) == [T[0], T[0], T[1], T[1], T[2], T[2]]
    for tag in ("job", "dag", "index"):
        assert all(isinstance(v, str) for v in gpu[tag])
    assert list(gpu["job"]) == ["0", "0", "1", "1", "1,2", "1,2"] and list(gpu["index"]) == ["0", "1"] * 3
    assert gpu["memory_used"].isna().tolist() == [False] * 5 + [True]
    host = backend.frame("host", ["cpu_percent"], W)
    assert list(host.columns) == ["time", "job", "dag", "cpu_percent"] and list(host["cpu_percent"]) == [5, 50.5, 75.25]
    worker = backend.frame("worker", ["tasks", "running"], W)
    assert list(worker["tasks"]) == [0, 2, 3] and worker["running"].iloc[2] == '["a", ["b", 1]]'
    fake.answer = lambda flux: (200, "\r\n")
    empty = backend.frame("gpu", ["utilization_gpu"], W)
    assert empty.empty and list(empty.columns) == ["time", "job", "dag", "index", "utilization_gpu"]
    assert backend.first_time() is None and backend.tag_values("job") == [] and backend.fields() == {}
    assert list(backend.max_by("gpu", "utilization_gpu", ("worker", "index"))) == ["worker", "index", "max"]
    assert list(backend.dag_points().columns) == F.DAG_COLUMNS


def test_store_on_flux_equals_spool(fake, spool_store):
    flux = _connect(fake)
    assert flux.workers() == spool_store.workers() == [W]
    assert flux.jobs() == spool_store.jobs() == [1, 2]
    assert flux.fields() == spool_store.fields()
    assert flux.origin_ns == spool_store.origin_ns == T0
    metrics = ["compute-util", "total-mem", "host-cpu", "tasks"]
    a, b = query.worker_tables(flux, metrics=metrics), query.worker_tables(spool_store, metrics=metrics)
    assert list(a) == list(b) == [W] and len(a[W]) == 3
    pd.testing.assert_frame_equal(a[W], b[W], check_dtype=False)
    # points without a session id: the spool's is its folder's name, InfluxDB's "unnamed"
    assert list(flux.dags()["session"]) == ["unnamed"] * 2 and list(spool_store.dags()["session"]) == [SID] * 2
    pd.testing.assert_frame_equal(
        flux.dags().drop(columns="session"), spool_store.dags().drop(columns="session"), check_dtype=False
    )
    assert list(flux.dags()["status"]) == ["ok", "erred"] and flux.dags()["label"].iloc[1] == 'client "2" x'
    server = query.peaks(flux, "compute-util", per_job=True, server=True)
    pd.testing.assert_frame_equal(
        server, query.peaks(spool_store, "compute-util", per_job=True, server=False), check_dtype=False
    )
    assert query.get_peaks(flux, "compute-util") == [{1: [90, 60], 2: [90, 60]}]
    assert 'group(columns: ["worker", "index", "job"])' in fake.queries()[-1]


def test_backend_answers_equal_influxql(fake, fresh_db, influxd):
    """The same points in influxd 1.6.7, asked with InfluxQL: same columns, tag strings, values."""
    from dask_influx_metrics.client.query.influxql import InfluxQLBackend

    influxd.write(b"\n".join(lineprotocol.encode_many(points())), db=fresh_db)
    ql, fx = InfluxQLBackend(influxd.url, fresh_db), _connect(fake).backend
    assert ql.fields() == fx.fields()
    assert ql.tag_values("worker") == fx.tag_values("worker") and ql.tag_values("job") == fx.tag_values("job")
    assert ql.first_time() == fx.first_time() == T0
    for m, fields in (
        ("gpu", ["utilization_gpu", "memory_used"]),
        ("host", ["cpu_percent"]),
        ("worker", ["tasks", "running"]),
    ):
        a, b = fx.frame(m, fields, W), ql.frame(m, fields, W)
        assert sorted(a.columns) == sorted(b.columns), m
        keys = ["time", "index"] if "index" in a else ["time"]
        b = b[list(a.columns)].sort_values(keys, kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b, check_dtype=False)
        assert b["time"].dtype == a["time"].dtype == "int64"
        for tag in ("job", "dag", "index"):
            if tag in a:
                assert pd.api.types.is_string_dtype(a[tag]) and a[tag].dtype == b[tag].dtype, (m, tag)
    by = ("worker", "index", "job")
    a, b = fx.max_by("gpu", "utilization_gpu", by, [W]), ql.max_by("gpu", "utilization_gpu", by, [W])
    pd.testing.assert_frame_equal(a, b.sort_values(list(by), kind="stable").reset_index(drop=True), check_dtype=False)
    a, b = fx.dag_points(), ql.dag_points()
    pd.testing.assert_frame_equal(a, b[list(a.columns)].sort_values("time").reset_index(drop=True), check_dtype=False)


def test_store_as_context_manager_closes_the_client(fake):
    with _connect(fake) as db:
        assert db.jobs() == [1, 2] and db.backend._client.api_client is not None
    assert db.closed and db.backend._client.api_client is None  # InfluxDBClient.close() ran


# --- errors ------------------------------------------------------------------------
def test_unreachable():
    with pytest.raises(QueryError, match=r"cannot reach InfluxDB at http://127\.0\.0\.1:1\b"):
        query.connect("http://127.0.0.1:1", database="b", language="flux", timeout=2)


def test_unknown_bucket_lists_buckets(fake):
    with pytest.raises(
        QueryError,
        match=r"bucket 'nope' not found at http://127\.0\.0\.1:\d+; "
        r"buckets: \['_monitoring', '_tasks', 'dask_metrics'\]",
    ):
        _connect(fake, database="nope")
    # InfluxDB 1.8: buckets are database/retention-policy; the database alone is its default policy
    fake.answer = lambda flux: (200, ANSWERS["buckets"].replace("dask_metrics", "dask_metrics/autogen"))
    assert _connect(fake).backend.bucket == "dask_metrics"


@pytest.mark.parametrize(
    "status, body",
    [
        (400, {"code": "invalid", "message": "compilation failed: error at @3:8-3:9: undefined identifier x"}),
        (404, {"code": "not found", "message": 'failed to initialize execute state: could not find bucket "gone"'}),
        (401, {"code": "unauthorized", "message": "unauthorized access"}),
    ],
)
def test_http_errors_name_the_query(fake, status, body):
    backend = _connect(fake).backend
    fake.answer = lambda flux: (status, json.dumps(body))
    with pytest.raises(QueryError) as info:
        backend.frame("host", ["cpu_percent"], W)
    message = str(info.value)
    assert f"InfluxDB at {fake.url} refused the Flux query (HTTP {status}): {body['message']}" in message
    assert F.flux_frame_query("dask_metrics", "host", ["cpu_percent"], W) in message
    with pytest.raises(QueryError, match=r"refused the Flux query \(HTTP \d+\).*\nbuckets\(\)"):
        _connect(fake)


def test_missing_client_names_the_extra(monkeypatch, fake):
    monkeypatch.setitem(sys.modules, "influxdb_client", None)
    with pytest.raises(ImportError, match=r"pip install dask-influx-metrics\[flux\]"):
        _connect(fake)


def _without_dag(text: str) -> str:
    """A canned answer as it reads with dag-tag: false before dag is asked for: no dag column."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    for block in text.strip("\r\n").split("\r\n\r\n"):  # one table each: annotations, header, rows
        rows = list(csv.reader(io.StringIO(block)))
        at = next(r for r in rows if r[0] == "").index("dag")
        writer.writerows([r[:at] + r[at + 1 :] for r in rows] + [[]])
    return out.getvalue()


def test_dag_as_a_field_is_found_and_read(fake):
    """dag-tag: false: the first frame answer has no dag column, so the frame is asked again with the
    dag field pivoted in (remembered); busy peaks pivot before filtering on dag."""
    tagged = _connect(fake).backend.frame("gpu", ["utilization_gpu", "memory_used"], W)
    fake.answer = lambda flux: (200, ANSWERS["gpu"] if 'r._field == "dag"' in flux else _without_dag(ANSWERS["gpu"]))
    backend = _connect(fake).backend
    frame = backend.frame("gpu", ["utilization_gpu", "memory_used"], W)
    pd.testing.assert_frame_equal(frame, tagged)
    asked = fake.queries()[-2:]
    assert (
        'r._field == "dag"' not in asked[0]
        and '(r._field == "utilization_gpu" or r._field == "memory_used" or r._field == "dag")' in asked[1]
    )
    backend.frame("host", ["cpu_percent"], W)
    assert 'r._field == "dag"' in fake.queries()[-1]  # remembered: one question per frame from now on
    assert backend.dag_is_field()
    backend.max_by("gpu", "memory_used", ("worker", "index", "job"), [W], 2, busy=True)
    assert fake.queries()[-1].endswith(
        '    |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        '    |> filter(fn: (r) => r.dag != "0" and exists r["memory_used"])\n'
        '    |> map(fn: (r) => ({r with _value: r["memory_used"]}))\n'
        '    |> group(columns: ["worker", "index", "job"])\n    |> max()\n'
        '    |> keep(columns: ["worker", "index", "job", "_value"])\n'
    )


# --- accounting: each row's last values, as InfluxDB 2.x answers flux_last_query --------------------
ACCOUNTING_POINTS = [  # two points of a GPU row (the last carries the totals), a CPU row, an idle row
    Point(
        ACCOUNTING,
        {"host": "n", "worker": "agent-n", "job": "1", "uuid": "GPU-1", "since": "5"},
        {"gpu_seconds": 1.0, "busy_seconds": 0.5},
        T0,
    ),
    Point(
        ACCOUNTING,
        {"host": "n", "worker": "agent-n", "job": "1", "uuid": "GPU-1", "since": "5"},
        {"gpu_seconds": 2.0, "busy_seconds": 1.5, "energy_joules": 300.0},
        T[1],
    ),
    Point(ACCOUNTING, {"host": "n", "worker": "agent-n", "job": "1", "since": "5"}, {"cpu_seconds": 4.25}, T[1]),
    Point(
        ACCOUNTING,
        {"host": "n", "worker": "agent-n", "job": "idle", "uuid": "GPU-1", "since": "5"},
        {"gpu_seconds": 7.0, "busy_seconds": 0.0, "energy_joules": 700.0},
        T[1],
    ),
]
LAST_ANSWER = crlf("""
#datatype,string,long,string,string,string,string,string,double,double,double,double
#group,false,false,false,false,false,false,false,false,false,false,false
#default,_result,,,,,,,,,,
,result,table,host,worker,job,uuid,since,busy_seconds,cpu_seconds,energy_joules,gpu_seconds
,,0,n,agent-n,1,,5,,4.25,,
,,0,n,agent-n,1,GPU-1,5,1.5,,300,2
,,0,n,agent-n,idle,GPU-1,5,0,,700,7
""")


def test_accounting_reads_alike_from_flux_and_the_spool(fake, tmp_path):
    fake.answer = lambda flux: (200, LAST_ANSWER) if "last()" in flux else answer(flux)
    folder = tmp_path / "20240501T120000-000001" / "agent-n"
    folder.mkdir(parents=True)
    (folder / "spool-1-000000.lp").write_bytes(b"\n".join(lineprotocol.encode_many(ACCOUNTING_POINTS)) + b"\n")
    with _connect(fake) as flux, query.connect(tmp_path) as spool:
        theirs, ours = query.accounting(flux), query.accounting(spool)
    pd.testing.assert_frame_equal(theirs, ours)
    assert ours.loc[ours["uuid"].eq("GPU-1") & ours["job"].eq(1), "busy_seconds"].item() == 1.5
    (sent,) = [q for q in fake.queries() if "last()" in q]
    assert (
        'r._measurement == "accounting"' in sent
        and 'group(columns: ["host", "worker", "job", "session", "uuid", "since"])' in sent
    )
