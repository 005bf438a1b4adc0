"""A fake InfluxDB 2.x for the Flux backend's tests: hand-written annotated CSV answers
(what 2.x sends: CRLF lines, ``#datatype``/``#group``/``#default`` blocks, RFC3339Nano times)
served over HTTP on 127.0.0.1, plus the points they describe."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse

from dask_influx_metrics.schema import Point

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
    dag = [
        (T[0] + 100, "1", "running", {"event": "submit", "tasks": 4, "label": "client-1"}),
        (T[1] + 100, "2", "running", {"event": "submit", "tasks": 2, "label": 'client "2" x'}),
        (T[2] + 100, "1", "ok", {"event": "end", "duration": 1.0000001}),
        (T[2] + 200, "2", "erred", {"event": "end", "duration": 0.5000001}),
    ]
    out += [Point("dag", {"job": d}, {"dag": d, "status": s, **f}, t) for t, d, s, f in dag]
    return out


def crlf(text: str) -> str:
    """InfluxDB's line endings, and the empty line that ends each result."""
    return "\r\n".join(text.strip("\n").split("\n")) + "\r\n\r\n"


ANSWERS = {
    "buckets": crlf("""
#datatype,string,long,string
#group,false,false,false
#default,_result,,
,result,table,name
,,0,_monitoring
,,0,_tasks
,,0,dask_metrics
"""),
    "fields": crlf("""
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
    "worker": crlf(f"""
#datatype,string,long,string
#group,false,false,false
#default,_result,,
,result,table,_value
,,0,{W}
"""),
    "job": crlf("""
#datatype,string,long,string
#group,false,false,false
#default,_result,,
,result,table,_value
,,0,0
,,0,1
,,0,"1,2"
"""),
    "first": crlf("""
#datatype,string,long,dateTime:RFC3339
#group,false,false,false
#default,_result,,
,result,table,_time
,,0,2024-05-01T12:00:00.000000001Z
"""),
    # pivot |> keep: one table per series (dag, index, job); the last series lacks memory_used
    "gpu": crlf("""
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
    "host": crlf("""
#datatype,string,long,dateTime:RFC3339,string,string,double
#group,false,false,false,true,true,false
#default,_result,,,,,
,result,table,_time,dag,job,cpu_percent
,,0,2024-05-01T12:00:00.000000001Z,0,0,5
,,1,2024-05-01T12:00:00.500000001Z,1,1,50.5
,,2,2024-05-01T12:00:01.000000001Z,"1,2","1,2",75.25
"""),
    "worker_frame": crlf("""
#datatype,string,long,dateTime:RFC3339,string,string,string,long
#group,false,false,false,true,true,false,false
#default,_result,,,,,,
,result,table,_time,dag,job,running,tasks
,,0,2024-05-01T12:00:00.000000001Z,0,0,[],0
,,1,2024-05-01T12:00:00.500000001Z,1,1,"[""a""]",2
,,2,2024-05-01T12:00:01.000000001Z,"1,2","1,2","[""a"", [""b"", 1]]",3
"""),
    # group(columns: ["worker", "index", "job"]) |> max() |> keep(): columns in input order
    "max": crlf(f"""
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
    "dag": crlf("""
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
    for marker, name in (
        ("buckets()", "buckets"),
        ('distinct(column: "_field")', "fields"),
        ('distinct(column: "worker")', "worker"),
        ('distinct(column: "job")', "job"),
        ("first()", "first"),
        ("max()", "max"),
        ('r._measurement == "dag"', "dag"),
        ('r._measurement == "gpu" and', "gpu"),
        ('r._measurement == "host" and', "host"),
        ('r._measurement == "worker" and', "worker_frame"),
    ):
        if marker in flux:
            return 200, ANSWERS[name]
    return 200, "\r\n"  # no tables


# --- a fake InfluxDB 2.x -----------------------------------------------------------
class LoopbackServer:
    """An HTTP server on 127.0.0.1 answering every request with ``self.handle(method, path,
    params, headers, body) -> (status, content type, text)``; ``url``, ``stop()``."""

    def serve(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                url = urllib.parse.urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, ctype, text = fake.handle(
                    self.command, url.path, dict(urllib.parse.parse_qsl(url.query)), self.headers, body
                )
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
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


class FakeInflux(LoopbackServer):
    """``POST /api/v2/query`` on 127.0.0.1, answered by ``self.answer(flux) -> (status, body)``."""

    def __init__(self):
        self.requests: list[dict] = []
        self.answer = answer
        self.serve()

    def handle(self, method, path, params, headers, body):
        body = json.loads(body or b"{}")
        self.requests.append({"method": method, "path": path, "headers": dict(headers), "params": params, "body": body})
        if method == "POST" and path == "/api/v2/query":
            status, text = self.answer(body.get("query", ""))
            return status, "text/csv; charset=utf-8" if status == 200 else "application/json", text
        return 404, "application/json", json.dumps({"code": "not found", "message": "path not found"})

    def queries(self) -> list[str]:
        return [r["body"].get("query") for r in self.requests]
