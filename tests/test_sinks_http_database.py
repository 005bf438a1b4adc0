"""Issue 45 item 3: the http sink creates a missing 1.x database (as Telegraf does), says once where it
may not, and readers that find no database point at the undelivered copy."""

from __future__ import annotations

import json
import logging
import time
import uuid

import pytest
from fake_influx2 import LoopbackServer
from polling import wait_until

from dask_influx_metrics import query
from dask_influx_metrics.sinks.http import HttpOptions, HttpSink
from dask_influx_metrics.sinks.journal import JournaledHttpSink
from dask_influx_metrics.sinks.spool import SpoolSink, read_lines, spool_files

LINE = b"gpu,host=h,worker=tcp://w:1,session=s1 utilization_gpu=5.0 %d"


def _databases(influxd) -> list[str]:
    return [row["name"] for row in influxd.query("SHOW DATABASES")]


def _lines(n: int) -> list[bytes]:
    return [LINE % (1_700_000_000_000_000_000 + k) for k in range(n)]


def test_a_fresh_influxdb_gets_its_database_and_the_first_sample_lands(influxd, tmp_path, caplog):
    database = "fresh_" + uuid.uuid4().hex[:8]
    assert database not in _databases(influxd)
    sink = HttpSink(influxd.url, database, HttpOptions(flush_interval=0.05), fallback=SpoolSink(tmp_path / "u"))
    with caplog.at_level(logging.INFO, logger="dask_influx_metrics.sinks.http"):
        sink.send(_lines(3))
        sink.close()
    assert (sink.points_written, sink.points_failed, sink.errors) == (3, 0, 0)
    assert influxd.query('SELECT count("utilization_gpu") FROM "gpu"', db=database)[0]["count"] == 3
    assert [r.levelname for r in caplog.records] == ["INFO"] and "created it" in caplog.text
    assert list(read_lines(tmp_path / "u")) == []


def test_the_journaled_sink_creates_it_too_its_lines_on_disk_first(influxd, tmp_path):
    database = "fresh_" + uuid.uuid4().hex[:8]
    options = HttpOptions(flush_interval=3600)  # posted only when drained: the journal is seen first
    sink = JournaledHttpSink(influxd.url, database, options, journal=tmp_path / "u")
    try:
        assert sink.take(_lines(3)) == 3 and len(list(read_lines(tmp_path / "u"))) == 3
        assert sink.drain(10)
    finally:
        sink.close()
    assert (sink.points_written, sink.points_failed, sink.errors) == (3, 0, 0)
    assert influxd.query('SELECT count("utilization_gpu") FROM "gpu"', db=database)[0]["count"] == 3
    assert spool_files(tmp_path / "u") == []


def test_create_database_off_keeps_the_lines_undelivered(influxd, tmp_path, caplog):
    database = "fresh_" + uuid.uuid4().hex[:8]
    sink = HttpSink(
        influxd.url,
        database,
        HttpOptions(flush_interval=0.05, create_database=False),
        fallback=SpoolSink(tmp_path / "u"),
    )
    sink.send(_lines(2))
    sink.close()
    assert (sink.points_written, sink.points_failed) == (0, 2) and database not in _databases(influxd)
    assert len(list(read_lines(tmp_path / "u"))) == 2 and "database not found" in caplog.text


class Forbidden(LoopbackServer):
    """A 1.x whose user may write but not create databases (or a 2.x without a DBRP mapping)."""

    def __init__(self):
        self.requests: list[tuple] = []
        self.serve()

    def handle(self, method, path, params, headers, body):
        self.requests.append((method, path, params.get("q")))
        if path == "/write":
            return 404, "application/json", json.dumps({"error": 'database not found: "nope"'})
        return 403, "application/json", json.dumps({"error": "error authorizing query: not authorized"})


def test_where_it_may_not_create_it_says_so_once(tmp_path, caplog):
    server = Forbidden()
    try:
        sink = HttpSink(
            server.url, "nope", HttpOptions(batch_size=2, flush_interval=0.05), fallback=SpoolSink(tmp_path)
        )
        for _ in range(3):
            sink.send(_lines(2))
            sink.drain(5)
        sink.close()
    finally:
        server.stop()
    creates = [r for r in server.requests if r[1] == "/query"]
    assert creates == [("POST", "/query", 'CREATE DATABASE "nope"')]
    assert sink.points_failed == 6 and len(list(read_lines(tmp_path))) == 6  # nothing lost
    warned = [r.getMessage() for r in caplog.records if "could not be created" in r.getMessage()]
    assert len(warned) == 1 and "HTTP 403" in warned[0] and "DBRP" in warned[0]


def test_the_journaled_sink_keeps_its_lines_and_tries_again_paced_where_it_may_not(tmp_path):
    server = Forbidden()
    sink = JournaledHttpSink(server.url, "nope", HttpOptions(batch_size=2, flush_interval=0.05), journal=tmp_path / "u")
    try:
        assert sink.take(_lines(4)) == 4
        wait_until(lambda: sink.points_kept == 4, timeout=10)
        time.sleep(0.5)  # a 4xx backs off as an outage does: no request loop against the server
    finally:
        sink.close()
        server.stop()
    writes = [r for r in server.requests if r[1] == "/write"]
    assert [r for r in server.requests if r[1] == "/query"] == [("POST", "/query", 'CREATE DATABASE "nope"')]
    assert 1 <= len(writes) <= 2, writes
    assert len(list(read_lines(tmp_path / "u"))) == 4 and sink.points_lost == 0  # all kept for later


def test_a_reader_that_finds_no_database_points_at_the_undelivered_copy(influxd, tmp_path):
    session = tmp_path / "20240501T120000-000001-abcdef"
    undelivered = SpoolSink(session / "agent-h" / "undelivered")  # an HTTP sink's copy of what it could not write
    undelivered.send(_lines(4))
    undelivered.close()
    with pytest.raises(query.QueryError) as info:
        query.connect(influxd.url, "not_there_" + uuid.uuid4().hex[:6], undelivered=session)
    message = str(info.value)
    assert "not found" in message and "the samples are not lost" in message
    assert "sample(s) under " + str(session / "agent-h" / "undelivered") in message and "replay" in message
    with pytest.raises(query.QueryError, match=r"not found.*an http sink creates a 1\.x database .*DBRP"):
        query.connect(influxd.url, "not_there_" + uuid.uuid4().hex[:6])


def test_monitor_over_http_into_a_fresh_database(client, influxd, tmp_path):
    """The whole path: a session's first samples land in a database nobody created."""
    from dask_influx_metrics import Monitor

    database = "fresh_" + uuid.uuid4().hex[:8]
    m = Monitor(
        client, sink="http", influxdb_url=influxd.url, database=database, gpu_source="simulated",
        spool_directory=str(tmp_path),
    )  # fmt: skip
    m.attach(polling_interval=50, tracking=["compute-util"])
    sid = m.start()["id"]
    try:
        client.gather(client.map(time.sleep, [0.2] * 4, pure=False))  # a builtin: workers import it
    finally:
        m.stop()
    with query.connect(influxd.url, database) as db:
        assert db.notes == [] and len(db.workers()) == 2 and db.sessions()["session"].tolist() == [sid]
    # nothing undelivered: the agent posts its last delivery counts after the workers left (stop() has returned),
    # each file leaving its undelivered copy once InfluxDB has it
    wait_until(lambda: list(read_lines(tmp_path / sid)) == [], 10, "the agent's last lines delivered")
    m.shutdown()
