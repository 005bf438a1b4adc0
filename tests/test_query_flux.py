"""The Flux backend without a Flux server: its Flux passes the Flux language server, and the real
``influxdb-client`` talks to a fake InfluxDB 2.x that answers with hand-written annotated CSV.

The CSV below follows what InfluxDB 2.x sends (flux ``csv.ResultEncoder``): CRLF lines; a
``#datatype``/``#group``/``#default`` block and a header whose first cell is empty; every
dateTime column annotated ``dateTime:RFC3339`` but written RFC3339Nano; a blank line and a new
block whenever the next table's columns differ; values with commas or quotes CSV-quoted. What it
cannot show is whether a real server runs the Flux as intended (pushdowns, pivot merging).
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
import urllib.parse

import pandas as pd
import pytest

pytest.importorskip("influxdb_client")

from dask_influx_metrics import lineprotocol, query  # noqa: E402
from dask_influx_metrics.query import QueryError, Store, flux as F  # noqa: E402
from dask_influx_metrics.query.spool import SpoolBackend  # noqa: E402
from dask_influx_metrics.schema import Point  # noqa: E402

W = "tcp://10.0.0.1:1234"
T0 = 1714564800000000001  # 2024-05-01T12:00:00.000000001Z
T = [T0, T0 + 500_000_000, T0 + 1_000_000_000]
JOBS = ["0", "1", "1,2"]  # job and dag tags at T[0], T[1], T[2]
HOSTILE = {"run": 'a"b\\c${x}', 'odd "key"': "tab\there\nnewline"}


# --- the data: as points (spool, influxd) and as InfluxDB 2.x would answer each question --------
def points() -> list[Point]:
    out = []
    gpu = {0: [(0.0, 100.0), (50.0, 1000.0), (90.0, 1500.0)], 1: [(0.0, 200.0), (20.0, 300.0), (60.0, None)]}
    for k, (t, job) in enumerate(zip(T, JOBS)):
        tags = {"host": "node1", "worker": W, "job": job, "dag": job}
        for index, samples in gpu.items():
            util, mem = samples[k]
            fields = {"utilization_gpu": util, **({"memory_used": mem} if mem is not None else {})}
            out.append(Point("gpu", {**tags, "index": str(index), "uuid": f"GPU-{index}", "name": "Sim"}, fields, t))
        out.append(Point("host", tags, {"cpu_percent": [5.0, 50.5, 75.25][k]}, t))
        out.append(Point("worker", tags, {"tasks": [0, 2, 3][k], "running": ['[]', '["a"]', '["a", ["b", 1]]'][k]}, t))
    dag = [(T[0] + 100, "1", "running", {"event": "submit", "tasks": 4, "label": "client-1"}),
           (T[1] + 100, "2", "running", {"event": "submit", "tasks": 2, "label": 'client "2" x'}),
           (T[2] + 100, "1", "ok", {"event": "end", "duration": 1.0000001}),
           (T[2] + 200, "2", "erred", {"event": "end", "duration": 0.5000001})]
    out += [Point("dag", {"job": d, "dag": d, "status": s}, f, t) for t, d, s, f in dag]
    return out


def _csv(text: str) -> str:
    """InfluxDB's line endings, and the empty line that ends each result."""
    return "\r\n".join(text.strip("\n").split("\n")) + "\r\n\r\n"


ANSWERS = {
    "buckets": _csv("""
#datatype,string,long,string
#group,false,false,false
#default,_result,,
,result,table,name
,,0,_monitoring
,,0,_tasks
,,0,dask_metrics
"""),
    "fields": _csv("""
#datatype,string,long,string,string
#group,false,false,false,false
#default,_result,,,
,result,table,measurement,field
,,0,gpu,memory_used
,,0,gpu,utilization_gpu
,,1,host,cpu_percent
,,2,worker,running
,,2,worker,tasks
"""),
    "worker": _csv(f"""
#datatype,string,long,string
#group,false,false,false
#default,_result,,
,result,table,_value
,,0,{W}
"""),
    "job": _csv("""
#datatype,string,long,string
#group,false,false,false
#default,_result,,
,result,table,_value
,,0,0
,,0,1
,,0,"1,2"
"""),
    "first": _csv("""
#datatype,string,long,dateTime:RFC3339
#group,false,false,false
#default,_result,,
,result,table,_time
,,0,2024-05-01T12:00:00.000000001Z
"""),
    # pivot |> keep: one table per series (dag, index, job); the last series lacks memory_used
    "gpu": _csv("""
#datatype,string,long,dateTime:RFC3339,string,string,string,double,double
#group,false,false,false,true,true,true,false,false
#default,_result,,,,,,,
,result,table,_time,dag,index,job,memory_used,utilization_gpu
,,0,2024-05-01T12:00:00.000000001Z,0,0,0,100,0
,,1,2024-05-01T12:00:00.000000001Z,0,1,0,200,0
,,2,2024-05-01T12:00:00.500000001Z,1,0,1,1000,50
,,3,2024-05-01T12:00:00.500000001Z,1,1,1,300,20
,,4,2024-05-01T12:00:01.000000001Z,"1,2",0,"1,2",1500,90

#datatype,string,long,dateTime:RFC3339,string,string,string,double
#group,false,false,false,true,true,true,false
#default,_result,,,,,,
,result,table,_time,dag,index,job,utilization_gpu
,,5,2024-05-01T12:00:01.000000001Z,"1,2",1,"1,2",60
"""),
    "host": _csv("""
#datatype,string,long,dateTime:RFC3339,string,string,double
#group,false,false,false,true,true,false
#default,_result,,,,,
,result,table,_time,dag,job,cpu_percent
,,0,2024-05-01T12:00:00.000000001Z,0,0,5
,,1,2024-05-01T12:00:00.500000001Z,1,1,50.5
,,2,2024-05-01T12:00:01.000000001Z,"1,2","1,2",75.25
"""),
    "worker_frame": _csv("""
#datatype,string,long,dateTime:RFC3339,string,string,string,long
#group,false,false,false,true,true,false,false
#default,_result,,,,,,
,result,table,_time,dag,job,running,tasks
,,0,2024-05-01T12:00:00.000000001Z,0,0,[],0
,,1,2024-05-01T12:00:00.500000001Z,1,1,"[""a""]",2
,,2,2024-05-01T12:00:01.000000001Z,"1,2","1,2","[""a"", [""b"", 1]]",3
"""),
    # group(columns: ["worker", "index", "job"]) |> max() |> keep(): columns in input order
    "max": _csv(f"""
#datatype,string,long,double,string,string,string
#group,false,false,false,true,true,true
#default,_result,,,,,
,result,table,_value,index,job,worker
,,0,0,0,0,{W}
,,1,50,0,1,{W}
,,2,90,0,"1,2",{W}
,,3,0,1,0,{W}
,,4,20,1,1,{W}
,,5,60,1,"1,2",{W}
"""),
    # submit and end points are series with different fields: two blocks
    "dag": _csv("""
#datatype,string,long,dateTime:RFC3339,string,string,string,string,string,long
#group,false,false,false,true,true,true,false,false,false
#default,_result,,,,,,,,
,result,table,_time,dag,job,status,event,label,tasks
,,0,2024-05-01T12:00:00.000000101Z,1,1,running,submit,client-1,4
,,1,2024-05-01T12:00:00.500000101Z,2,2,running,submit,"client ""2"" x",2

#datatype,string,long,dateTime:RFC3339,string,string,string,double,string
#group,false,false,false,true,true,true,false,false
#default,_result,,,,,,,
,result,table,_time,dag,job,status,duration,event
,,2,2024-05-01T12:00:01.000000101Z,1,1,ok,1.0000001,end
,,3,2024-05-01T12:00:01.000000201Z,2,2,erred,0.5000001,end
"""),
}


def answer(flux: str) -> tuple[int, str]:
    """Which canned answer a generated Flux query gets."""
    for marker, name in (("buckets()", "buckets"), ('distinct(column: "_field")', "fields"),
                         ('distinct(column: "worker")', "worker"), ('distinct(column: "job")', "job"),
                         ("first()", "first"), ("max()", "max"), ('r._measurement == "dag"', "dag"),
                         ('r._measurement == "gpu" and', "gpu"), ('r._measurement == "host" and', "host"),
                         ('r._measurement == "worker" and', "worker_frame")):
        if marker in flux:
            return 200, ANSWERS[name]
    return 200, "\r\n"  # no tables


# --- a fake InfluxDB 2.x -----------------------------------------------------------
class FakeInflux:
    """``POST /api/v2/query`` on 127.0.0.1, answered by ``self.answer(flux) -> (status, body)``."""

    def __init__(self):
        self.requests: list[dict] = []
        self.answer = answer
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                url = urllib.parse.urlsplit(self.path)
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append({"method": self.command, "path": url.path, "headers": dict(self.headers),
                                      "params": dict(urllib.parse.parse_qsl(url.query)), "body": body})
                if self.command == "POST" and url.path == "/api/v2/query":
                    status, text = fake.answer(body.get("query", ""))
                else:
                    status, text = 404, json.dumps({"code": "not found", "message": "path not found"})
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/csv; charset=utf-8" if status == 200 else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def queries(self) -> list[str]:
        return [r["body"].get("query") for r in self.requests]


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
    return query.connect(fake.url, database=kw.pop("database", "dask_metrics"), language="flux", org="my-org",
                         token="my-token", timeout=5, **kw)


@pytest.fixture
def spool_store(tmp_path):
    for folder, keep in (("tcp___10.0.0.1_1234", lambda p: p.measurement != "dag"),
                         ("scheduler", lambda p: p.measurement == "dag")):
        path = tmp_path / "20240501T120000-000001" / folder
        path.mkdir(parents=True)
        lines = lineprotocol.encode_many(p for p in points() if keep(p))
        (path / "spool-1-000000.lp").write_bytes(b"\n".join(lines) + b"\n")
    return query.connect(tmp_path)


# --- the Flux text -------------------------------------------------------------------
def _all_queries() -> dict[str, str]:
    out = {}
    for name, kw in {"plain": {}, "window": {"start_ns": T0, "stop_ns": T[2]},
                     "hostile": {"tags": HOSTILE, "start_ns": 0, "stop_ns": 2**62}}.items():
        out[f"fields-{name}"] = F.flux_fields_query('dask "metrics"/autogen', **kw)
        out[f"tags-{name}"] = F.flux_tag_values_query("b", "job", **kw)
        out[f"tags-odd-{name}"] = F.flux_tag_values_query("b", 'we"ird\\key', **kw)
        out[f"first-{name}"] = F.flux_first_time_query("b", **kw)
        out[f"dag-{name}"] = F.flux_dag_query("b", **kw)
        for m, fields in (("gpu", ["utilization_gpu", "memory_used"]), ("host", ["cpu_percent"]),
                          ("worker", ["tasks", "running"]), ("custom", ['my "metric"'])):
            for job in (None, 2):
                out[f"frame-{m}-{job}-{name}"] = F.flux_frame_query("b", m, fields, 'tcp://h:1"\\${x}', job, **kw)
        for by, workers, job in ((["worker", "index", "job"], [W, 'w"2\\'], 3), (["worker"], None, None),
                                 (["worker", "index"], [W], None)):
            out[f"max-{len(by)}-{job}-{name}"] = F.flux_max_query("b", "gpu", "memory_used", by, workers, job, **kw)
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
        '    |> keep(columns: ["_time", "job", "dag", "index", "utilization_gpu"])\n')
    assert "range(start: time(v: 0), stop: 1d)" in F.flux_first_time_query("b")
    assert F.flux_max_query("b", "host", "cpu_percent", ["worker", "job"], ["a", "b"]).endswith(
        '"cpu_percent" and (r.worker == "a" or r.worker == "b"))\n'
        '    |> group(columns: ["worker", "job"])\n    |> max()\n    |> keep(columns: ["worker", "job", "_value"])\n')
    assert F.string('say "hi" \\ ${x} $y\n') == '"say \\"hi\\" \\\\ \\${x} $y\\n"'


# --- annotated CSV ---------------------------------------------------------------------
def test_read_annotated_csv_types():
    text = _csv("""
#datatype,string,long,dateTime:RFC3339,string,long,double,boolean,string
#group,false,false,false,true,false,false,false,false
#default,_result,,,,,,,
,result,table,_time,index,n,x,ok,s
,,0,2024-05-01T12:00:00.000000001Z,007,1,1.5,true,"a,""b"" c"
,,0,2024-05-01T12:00:00Z,1e3,,,false,
""")
    frame = F.read_annotated_csv(text)
    assert list(frame.columns) == ["_time", "index", "n", "x", "ok", "s"]
    assert frame["_time"].dtype == "int64" and list(frame["_time"]) == [T0, T0 - 1]
    assert list(frame["index"]) == ["007", "1e3"]  # tags that look like numbers stay strings
    assert frame["n"].iloc[0] == 1 and pd.isna(frame["n"].iloc[1]) and pd.isna(frame["x"].iloc[1])
    assert list(frame["ok"]) == [True, False] and frame["s"].iloc[0] == 'a,"b" c' and pd.isna(frame["s"].iloc[1])
    assert F.read_annotated_csv("").empty and F.read_annotated_csv("\r\n").empty


@pytest.mark.parametrize("text", [
    "error,reference\r\nfailed to read: boom,\r\n",  # InfluxDB 2.x: the error after the tables it sent
    _csv("#datatype,string,string\n#group,true,true\n#default,,\n,error,reference\n,failed to read: boom,"),
])
def test_error_table_raises(text):
    with pytest.raises(QueryError, match=r"failed to read: boom\nmy query"):
        F.read_annotated_csv(ANSWERS["host"].rstrip("\r\n") + "\r\n\r\n" + text, "my query")


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
    assert fake.queries() == [F.BUCKETS_QUERY, F.flux_frame_query(
        "dask_metrics", "gpu", ["utilization_gpu", "memory_used"], W, 2, {"run": "r1"}, start_ns=T0)]
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
    a, b = flux.worker_tables(metrics=metrics), spool_store.worker_tables(metrics=metrics)
    assert list(a) == list(b) == [W] and len(a[W]) == 3
    pd.testing.assert_frame_equal(a[W], b[W], check_dtype=False)
    pd.testing.assert_frame_equal(flux.dags(), spool_store.dags(), check_dtype=False)
    assert list(flux.dags()["status"]) == ["ok", "erred"] and flux.dags()["label"].iloc[1] == 'client "2" x'
    server = flux.peaks("compute-util", per_job=True, server=True)
    pd.testing.assert_frame_equal(server, spool_store.peaks("compute-util", per_job=True, server=False),
                                  check_dtype=False)
    assert flux.get_peaks("compute-util") == [{1: [90, 60], 2: [90, 60]}]
    assert 'group(columns: ["worker", "index", "job"])' in fake.queries()[-1]


def test_backend_answers_equal_influxql(fake, fresh_db, influxd):
    """The same points in influxd 1.6.7, asked with InfluxQL: same columns, tag strings, values."""
    from dask_influx_metrics.query.influxql import InfluxQLBackend

    influxd.write(b"\n".join(lineprotocol.encode_many(points())), db=fresh_db)
    ql, fx = InfluxQLBackend(influxd.url, fresh_db), _connect(fake).backend
    assert ql.fields() == fx.fields()
    assert ql.tag_values("worker") == fx.tag_values("worker") and ql.tag_values("job") == fx.tag_values("job")
    assert ql.first_time() == fx.first_time() == T0
    for m, fields in (("gpu", ["utilization_gpu", "memory_used"]), ("host", ["cpu_percent"]),
                      ("worker", ["tasks", "running"])):
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


# --- errors ------------------------------------------------------------------------
def test_unreachable():
    with pytest.raises(QueryError, match=r"cannot reach InfluxDB at http://127\.0\.0\.1:1\b"):
        query.connect("http://127.0.0.1:1", database="b", language="flux", timeout=2)


def test_unknown_bucket_lists_buckets(fake):
    with pytest.raises(QueryError, match=r"bucket 'nope' not found at http://127\.0\.0\.1:\d+; "
                                         r"buckets: \['_monitoring', '_tasks', 'dask_metrics'\]"):
        _connect(fake, database="nope")
    # InfluxDB 1.8: buckets are database/retention-policy; the database alone is its default policy
    fake.answer = lambda flux: (200, ANSWERS["buckets"].replace("dask_metrics", "dask_metrics/autogen"))
    assert _connect(fake).backend.bucket == "dask_metrics"


@pytest.mark.parametrize("status, body", [
    (400, {"code": "invalid", "message": "compilation failed: error at @3:8-3:9: undefined identifier x"}),
    (404, {"code": "not found", "message": 'failed to initialize execute state: could not find bucket "gone"'}),
    (401, {"code": "unauthorized", "message": "unauthorized access"}),
])
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
