"""HttpSink: real writes to influxd, fallback on every kind of failure, never blocking."""

from __future__ import annotations

import gc
import logging
import socket
import time

import requests
from listsink import ListSink

from dask_influx_metrics.sinks.http import HttpOptions, HttpSink
from dask_influx_metrics.sinks.spool import read_lines

BASE_NS = 1_700_000_000_000_000_000


def numbered(n, measurement="m", start=0):
    return [b"%s,t=x v=%di %d" % (measurement.encode(), i, BASE_NS + i) for i in range(start, start + n)]


def dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % s.getsockname()[1]


def test_batches_reach_influxd(influxd, fresh_db):
    sink = HttpSink(influxd.url, fresh_db, HttpOptions(batch_size=100, flush_interval=0.05, max_pending=2000))
    lines = numbered(1000)
    for i in range(0, 1000, 37):
        sink.send(lines[i : i + 37])
    influxd.wait_for("SELECT count(v) FROM m", lambda rows: rows and rows[0]["count"] == 1000, db=fresh_db)
    sink.close()
    assert (sink.points_written, sink.points_failed, sink.pending) == (1000, 0, 0)


def test_close_flushes_what_is_queued(influxd, fresh_db):
    sink = HttpSink(influxd.url, fresh_db, HttpOptions(batch_size=10_000, flush_interval=3600))
    sink.send(numbered(250))
    sink.close()  # neither batch size nor interval reached: close must flush
    assert influxd.query("SELECT count(v) FROM m", db=fresh_db)[0]["count"] == 250


def test_dead_url_sends_every_line_to_the_fallback(caplog):
    fallback = ListSink()
    sink = HttpSink(dead_url(), "db", HttpOptions(batch_size=40, flush_interval=0.01, timeout=2), fallback=fallback)
    lines = numbered(250)
    with caplog.at_level(logging.WARNING, logger="dask_influx_metrics.sinks.http"):
        for i in range(0, 250, 25):
            sink.send(lines[i : i + 25])
        sink.close()
    assert sorted(fallback.lines) == sorted(lines) and fallback.closed
    assert (sink.points_written, sink.points_failed) == (0, 250)
    assert len([r for r in caplog.records if "cannot reach" in r.message]) == 1  # once, not per batch


def test_a_post_that_cannot_reach_the_server_leaves_no_frame_for_the_garbage_collector():
    """The failed request's frames (which hold its body: a whole batch) are freed at once, not when the cyclic
    collector runs (late, for the oldest generation): with the server down, a worker's memory grew meanwhile."""
    sink = HttpSink(dead_url(), "db", HttpOptions(batch_size=1000, flush_interval=0.0, timeout=2), fallback=ListSink())
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable is kept in gc.garbage, to be looked at
    try:
        sink.send(numbered(1000))
        assert sink.drain(10) and sink.points_failed == 1000
        gc.collect()
        frames = [o for o in gc.garbage if type(o).__name__ == "frame"]
        mine = [
            f.f_code.co_name for f in frames if any(p in f.f_code.co_filename for p in ("requests", "urllib3", "sinks"))
        ]
        assert mine == []  # (before: urlopen, _make_request, request, ... five of them holding the body)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        sink.close()


def test_a_line_influxd_cannot_parse_is_kept_alone_with_the_reason_never_counted_written(
    influxd, fresh_db, tmp_path, caplog
):
    fallback, refused = ListSink(), tmp_path / "refused"
    sink = HttpSink(influxd.url, fresh_db, HttpOptions(flush_interval=0.01), fallback=fallback, refused=refused)
    batch = [b"m,t=x v=1i 1", b"this is not line protocol"]
    with caplog.at_level(logging.WARNING, logger="dask_influx_metrics.sinks.http"):
        sink.send(batch)
        sink.close()
    assert (sink.points_written, sink.points_refused, sink.points_failed) == (1, 1, 0) and fallback.lines == []
    assert list(read_lines(refused)) == [b"this is not line protocol"]
    reasons = (refused / "reasons.txt").read_text()
    assert "HTTP 400" in reasons and "unable to parse 'this is not line protocol'" in reasons
    assert any(
        "HTTP 400" in r.message and "unable to parse" in r.message and str(refused) in r.message for r in caplog.records
    )


def test_a_field_type_conflict_keeps_exactly_the_refused_lines(influxd, fresh_db, tmp_path):
    """Issue 23 item 1: a foreign string in gpu.utilization_gpu; our float points are refused, not 'written'."""
    influxd.write(b'gpu,host=other utilization_gpu="foreign" %d' % (BASE_NS - 1), db=fresh_db)  # same shard
    gpu = [b"gpu,host=h,index=0 utilization_gpu=%d.5 %d" % (i, BASE_NS + i) for i in range(10)]
    host = [b"host,host=h cpu_percent=%d.0 %d" % (i, BASE_NS + i) for i in range(5)]
    refused = tmp_path / "refused"
    sink = HttpSink(influxd.url, fresh_db, HttpOptions(flush_interval=0.01), refused=refused, fallback=ListSink())
    sink.send([line for pair in zip(gpu, host + [b""] * 5) for line in pair if line])
    sink.close()
    assert (sink.points_written, sink.points_refused, sink.points_failed) == (5, 10, 0)
    assert list(read_lines(refused)) == gpu
    assert (
        'field type conflict: input field "utilization_gpu" on measurement "gpu"'
        in (refused / "reasons.txt").read_text()
    )
    assert influxd.query("SELECT count(cpu_percent) FROM host", db=fresh_db)[0]["count"] == 5


class BodyLimit:
    """A proxy on 127.0.0.1 in front of influxd that answers 413 to bodies over ``limit`` bytes."""

    def __init__(self, target: str, limit: int):
        import http.server
        import threading

        outer = self
        self.posts, self.too_large = 0, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.posts += 1
                if len(body) > limit:
                    outer.too_large += 1
                    self.send_response(413)
                    self.end_headers()
                    self.wfile.write(b"<html>413 Request Entity Too Large</html>")
                    return
                r = requests.post(target + self.path, data=body, timeout=10)
                self.send_response(r.status_code)
                self.end_headers()
                self.wfile.write(r.content)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def test_http_413_splits_batches_down_to_what_fits_says_so_once_and_counts_it(influxd, fresh_db, tmp_path, caplog):
    """Issue 23 item 10: behind a 4 kB body limit every line lands; one line over the limit is kept as refused."""
    proxy = BodyLimit(influxd.url, 4096)
    try:
        refused = tmp_path / "refused"
        sink = HttpSink(
            proxy.url,
            fresh_db,
            HttpOptions(batch_size=500, flush_interval=0.05, max_pending=10_000),
            refused=refused,
            fallback=ListSink(),
        )
        lines = numbered(2000)
        huge = b'm,t=x s="%s" %d' % (b"x" * 5000, BASE_NS + 10**6)
        with caplog.at_level(logging.WARNING, logger="dask_influx_metrics.sinks.http"):
            for i in range(0, 2000, 100):
                sink.send(lines[i : i + 100])
            sink.send([huge])
            sink.close()
    finally:
        proxy.close()
    assert influxd.query("SELECT count(v) FROM m", db=fresh_db)[0]["count"] == 2000
    assert (sink.points_written, sink.points_refused, sink.points_failed) == (2000, 1, 0)
    assert sink.batches_split >= 1 and sink.batch_size <= 250
    assert list(read_lines(refused)) == [huge] and "HTTP 413" in (refused / "reasons.txt").read_text()
    splits = [r for r in caplog.records if "HTTP 413" in r.message and "splitting" in r.message]
    assert len(splits) == 1


def test_counters_name_the_failed_refused_and_spooled_lines(tmp_path):
    from dask_influx_metrics.sinks.spool import SpoolSink

    sink = HttpSink(
        dead_url(), "db", HttpOptions(timeout=1, flush_interval=0.01), fallback=SpoolSink(tmp_path / "undelivered")
    )
    sink.send(numbered(7))
    sink.close()
    [http] = sink.counters()
    assert http["kind"] == "http" and http["points_failed"] == 7 and http["points_spooled"] == 7
    assert http["points_refused"] == 0 and http["batches_split"] == 0 and http["errors"] == 1


def test_send_never_blocks_on_a_hung_server_and_close_is_bounded():
    with socket.socket() as server:  # accepts connections (backlog) but never answers
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        fallback = ListSink()
        sink = HttpSink(
            "http://127.0.0.1:%d" % server.getsockname()[1],
            "db",
            HttpOptions(batch_size=10, flush_interval=0.0, timeout=30, max_pending=100),
            fallback=fallback,
        )
        lines = numbered(1000)
        started = time.monotonic()
        for i in range(0, 1000, 10):
            sink.send(lines[i : i + 10])
        assert time.monotonic() - started < 0.5  # the writer thread is stuck, send is not
        started = time.monotonic()
        sink.close(wait=0.2)
        assert time.monotonic() - started < 2
        # everything except the batch stuck in the hung request reached the fallback
        assert len(fallback.lines) >= 990 and set(fallback.lines) <= set(lines)


class FakeSession:
    def __init__(self):
        self.calls = []

    def post(self, url, **kwargs):
        self.calls.append((url, kwargs))
        response = requests.Response()
        response.status_code = 204
        return response

    def close(self):
        pass


def test_url_params_and_auth():
    session = FakeSession()
    sink = HttpSink(
        "http://influx:8086/",
        "metrics",
        HttpOptions(retention_policy="week", token="t0k", flush_interval=0.0),
        session=session,
    )
    sink.send([b"m v=1i 1"])
    sink.close()
    url, kw = session.calls[0]
    assert url == "http://influx:8086/write"
    assert kw["params"] == {"db": "metrics", "rp": "week", "precision": "ns"}
    assert kw["headers"]["Authorization"] == "Token t0k" and kw["auth"] is None
    assert kw["data"] == b"m v=1i 1"

    session = FakeSession()
    sink = HttpSink("http://influx:8086", "metrics", HttpOptions(username="u", password="p"), session=session)
    sink.send([b"m v=1i 1"])
    sink.close()
    assert session.calls[0][1]["auth"] == ("u", "p")
    assert "Authorization" not in session.calls[0][1]["headers"]


def test_a_dead_server_is_tried_once_per_backoff_not_per_batch(tmp_path):
    """After a failed post, batches go straight to the fallback until the back-off ends."""
    import requests

    from dask_influx_metrics.sinks.spool import SpoolSink, read_lines

    class Counting(requests.Session):
        posts = 0

        def post(self, *a, **kw):
            Counting.posts += 1
            return super().post(*a, **kw)

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
    fallback = SpoolSink(tmp_path / "fallback")
    sink = HttpSink(dead, "db", HttpOptions(batch_size=10, flush_interval=0.0), fallback=fallback, session=Counting())
    lines = numbered(200)
    for i in range(0, 200, 10):
        sink.send(lines[i : i + 10])
    sink.close()
    assert Counting.posts == 1 and sink.points_failed == 200
    assert sorted(read_lines(tmp_path / "fallback")) == sorted(lines)


class ToggledServer:
    """An InfluxDB stand-in on a fixed port that answers 204 to every write, and can go away and return."""

    def __init__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self._handler, self._threading, self._http = Handler, threading, http.server
        self.port = None
        self.up()

    def up(self):
        server = self._http.ThreadingHTTPServer(("127.0.0.1", self.port or 0), self._handler)
        self.port = server.server_address[1]
        self.server = server
        self._threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()  # connections are refused from now on

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port


def measure_recovery(outage: float, interval: float = 0.05) -> float:
    """Seconds from the server's return to the sink's first successful write, worst case: the server
    comes back just after the first failed probe at least ``outage`` s into the outage. A sampler-like
    sender sends a line every ``interval`` s. Also a one-off script:
    ``cd tests && python -c "import test_sinks_http as t; print(t.measure_recovery(60))"``."""
    import threading

    server = ToggledServer()
    sink = HttpSink(server.url, "db", fallback=ListSink())
    stop = threading.Event()

    def sender():
        i = 0
        while not stop.wait(interval):
            sink.send(numbered(1, start=i))
            i += 1

    def wait_until(predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, what
            time.sleep(0.002)

    threading.Thread(target=sender, daemon=True).start()
    try:
        wait_until(lambda: sink.points_written, 10, "no write before the outage")
        server.down()
        time.sleep(outage)
        probe = sink._down_until
        wait_until(lambda: sink._down_until != probe, 60, "no probe")  # a probe just failed
        written = sink.points_written
        server.up()
        back = time.monotonic()
        wait_until(lambda: sink.points_written > written, 60, "no write within 60 s of the server's return")
        return time.monotonic() - back
    finally:
        stop.set()
        sink.close()
        server.down()


def test_writes_resume_within_5_s_of_the_servers_return():
    recovery = measure_recovery(outage=4)  # the back-off has reached its cap (1 s, 2 s, then 3 s)
    print(f"first successful write {recovery:.2f} s after the server returned (worst case)")
    assert recovery < 5.0


def test_an_outage_is_reported_once_however_long_it_lasts(caplog):
    fallback = ListSink()
    sink = HttpSink(
        dead_url(), "db", HttpOptions(batch_size=5, flush_interval=0.0, max_pending=10**6), fallback=fallback
    )
    sink.max_backoff = 0.2  # many retries in little time
    with caplog.at_level(logging.WARNING, logger="dask_influx_metrics.sinks.http"):
        deadline = time.monotonic() + 2.0
        i = 0
        while time.monotonic() < deadline:
            sink.send(numbered(5, start=i))
            i += 5
            time.sleep(0.01)
        sink.close()
    warnings = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "cannot reach" in warnings[0], warnings
    assert sink.points_failed == i == len(fallback.lines)


def test_the_reasons_file_is_private_by_design(tmp_path):
    """Issue 43 item 6: ``refused/reasons.txt`` 0600 whatever the umask, as the refused lines beside it."""
    import os

    from dask_influx_metrics.sinks.refused import RefusedFolder

    old = os.umask(0)
    try:
        folder = RefusedFolder(tmp_path / "refused")
        folder.keep([b"bad line"], "HTTP 400: unable to parse 'bad line'")
        folder.close()
    finally:
        os.umask(old)
    assert {f: oct(os.stat(tmp_path / "refused" / f).st_mode & 0o777) for f in os.listdir(tmp_path / "refused")} == {
        "reasons.txt": "0o600",
        next(f for f in os.listdir(tmp_path / "refused") if f.endswith(".lp")): "0o600",
    }
