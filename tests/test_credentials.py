"""Credentials travel only in an ``Authorization`` header: never in a request line, an exception,
a ``repr`` or a log record, whichever way they were given (arguments or ``user:password@`` URL)."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import threading
import urllib.parse

import pytest
from click.testing import CliRunner

from dask_influx_metrics import credentials, query
from dask_influx_metrics.client.cli import cli
from dask_influx_metrics.sinks.http import HttpOptions, HttpSink

PW = "s3cret-pw"


class Recorder:
    """InfluxDB 1.x's HTTP API, enough for connect/jobs/metrics and /write; records every request."""

    def __init__(self):
        self.requests: list[dict] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.requests.append({"line": self.requestline, "headers": dict(self.headers), "body": body})
                status, text = 204, ""
                if params.get("db") == "locked":
                    status, text = 401, json.dumps({"error": "authorization failed"})
                elif url.path == "/query" and params.get("q") == "SHOW DATABASES":
                    status, text = (
                        200,
                        json.dumps(
                            {
                                "results": [
                                    {
                                        "statement_id": 0,
                                        "series": [
                                            {
                                                "name": "databases",
                                                "columns": ["name"],
                                                "values": [["dask_metrics"], ["locked"]],
                                            }
                                        ],
                                    }
                                ]
                            }
                        ),
                    )
                elif url.path == "/query":
                    csv = "csv" in self.headers.get("Accept", "")
                    status, text = 200, "" if csv else json.dumps({"results": [{"statement_id": 0}]})
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.stop()


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{PW}".encode()).decode()


def _no_password_in(*texts) -> None:
    for text in texts:
        assert PW not in str(text)
        assert urllib.parse.quote(PW) not in str(text)


def test_no_password_anywhere(recorder, caplog):
    caplog.set_level(logging.DEBUG)  # urllib3 logs each request line at DEBUG
    shown = []
    for kw in (
        {"source": f"http://reader:{PW}@127.0.0.1:{recorder.port}"},
        {"source": f"http://127.0.0.1:{recorder.port}", "username": "reader", "password": PW},
    ):
        with query.connect(kw.pop("source"), **kw) as db:
            assert db.jobs() == [] and db.metrics() == []
            shown += [repr(db), db.scope(), db.not_found(), repr(db.backend.__dict__)]
        with pytest.raises(query.QueryError) as info:
            query.connect(f"http://reader:{PW}@127.0.0.1:{recorder.port}", "locked")
        shown.append(str(info.value))
    with pytest.raises(query.QueryError) as info:
        query.connect(f"http://reader:{PW}@127.0.0.1:1", timeout=2)
    assert str(info.value).startswith("cannot reach InfluxDB at http://127.0.0.1:1: ")
    shown.append(str(info.value))

    sink = HttpSink(f"http://writer:{PW}@127.0.0.1:{recorder.port}", "dask_metrics", HttpOptions(flush_interval=0.01))
    sink.send([b"m v=1 1"])
    sink.close()
    dead = HttpSink(f"http://writer:{PW}@127.0.0.1:1", "dask_metrics", HttpOptions(timeout=1, flush_interval=0.01))
    dead.send([b"m v=1 1"])
    dead.close()
    assert sink.points_written == 1 and dead.points_failed == 1
    shown += [sink.url, dead.url, repr(sink.__dict__.get("params"))]

    result = CliRunner().invoke(cli, ["jobs", "--source", f"http://reader:{PW}@127.0.0.1:1", "--timeout", "2"])
    assert result.exit_code == 2
    shown += [result.output, result.stderr]

    reads = [r for r in recorder.requests if r["line"].startswith("GET /query")]
    writes = [r for r in recorder.requests if r["line"].startswith("POST /write")]
    assert len(reads) >= 6 and len(writes) == 1
    assert {r["headers"]["Authorization"] for r in reads} == {_basic("reader")}
    assert writes[0]["headers"]["Authorization"] == _basic("writer")
    assert any(r.levelno == logging.WARNING and "127.0.0.1:1" in r.getMessage() for r in caplog.records)
    _no_password_in(
        *shown, *(r["line"] for r in recorder.requests), *(logging.Formatter().format(r) for r in caplog.records)
    )


def test_flux_takes_the_url_credentials_as_its_token(caplog):
    pytest.importorskip("influxdb_client")
    from fake_influx2 import FakeInflux

    caplog.set_level(logging.DEBUG)
    fake = FakeInflux()
    try:
        host = fake.url.split("//")[1]
        with query.connect(f"http://reader:{PW}@{host}", language="flux", timeout=5) as db:
            db.jobs()
            shown = [repr(db), db.scope(), db.backend.url]
    finally:
        fake.stop()
    assert {r["headers"]["Authorization"] for r in fake.requests} == {f"Token reader:{PW}"}
    _no_password_in(
        *shown,
        *(r["path"] for r in fake.requests),
        *(json.dumps(r["params"]) for r in fake.requests),
        *(logging.Formatter().format(r) for r in caplog.records),
    )


def test_mask_url_shows_a_url_as_given_without_its_password():
    assert credentials.mask_url(f"http://reader:{PW}@influx:8086/x") == "http://reader:***@influx:8086/x"
    assert credentials.split_url(f"https://reader:{PW}@influx/") == ("https://influx/", "reader", PW)


def test_settings_repr_masks_a_url_password():
    from dask_influx_metrics.config import Settings

    settings = Settings.resolve({"influxdb.url": f"http://writer:{PW}@influx:8086", "influxdb.password": PW})
    assert "http://writer:***@influx:8086" in repr(settings)
    _no_password_in(repr(settings))
