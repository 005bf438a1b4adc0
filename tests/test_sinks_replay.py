"""The explicit replay: spool files into InfluxDB (lossless, back-pressured, files kept when not delivered),
every undelivered/ and refused/ folder of a session, and the delete of what a session left."""

from __future__ import annotations

import os

from test_sinks_http import dead_url
from test_sinks_spool import nasty_lines

from dask_influx_metrics import lineparse
from dask_influx_metrics.sinks.http import HttpOptions, HttpSink
from dask_influx_metrics.sinks.replay import remove_spool, replay, replay_folders
from dask_influx_metrics.sinks.spool import SpoolSink, read_lines, spool_files


def test_replay_into_real_influxd_loses_nothing(tmp_path, influxd, fresh_db):
    lines = nasty_lines(3000)
    spool = SpoolSink(tmp_path / "spool", mem_limit=500, max_file_bytes=100_000)
    spool.send(lines)
    spool.close()
    undelivered = tmp_path / "undelivered"
    # a queue of 200 lines, far smaller than the replay: replay must wait for room, never overflow
    http = HttpSink(
        influxd.url, fresh_db, HttpOptions(batch_size=100, flush_interval=0.01), fallback=SpoolSink(undelivered)
    )
    assert replay(tmp_path / "spool", http, remove=True, batch_size=400) == 3000
    http.close()
    assert http.points_written == 3000 and not spool_files(tmp_path / "spool")
    assert not spool_files(undelivered)
    rows = influxd.query("SELECT * FROM spool", db=fresh_db)
    assert len(rows) == 3000
    want = {p.time_ns: p for p in map(lineparse.parse, lines)}
    for row in rows:
        p = want[row["time"]]
        assert (row["s"], row["i"], row["host"], row["k"]) == (
            p.fields["s"],
            p.fields["i"],
            p.tags["host"],
            p.tags.get("k"),
        )


def test_failed_replay_is_kept_in_the_fallback_spool(tmp_path):
    lines = nasty_lines(100)
    sink = SpoolSink(tmp_path / "spool")
    sink.send(lines)
    sink.close()
    http = HttpSink(dead_url(), "db", HttpOptions(flush_interval=0.0), fallback=SpoolSink(tmp_path / "again"))
    assert replay(tmp_path / "spool", http) == 100
    http.close()
    assert list(read_lines(tmp_path / "again")) == lines and http.points_failed == 100


def test_replay_with_remove_keeps_every_file_a_dead_server_did_not_take(tmp_path):
    lines = nasty_lines(1000)
    sink = SpoolSink(tmp_path / "spool", mem_limit=250, max_file_bytes=20_000)
    sink.send(lines)
    sink.close()
    files = spool_files(tmp_path / "spool")
    assert len(files) > 1
    http = HttpSink(dead_url(), "db", HttpOptions(flush_interval=0.0), fallback=SpoolSink(tmp_path / "again"))
    assert replay(tmp_path / "spool", http, remove=True) == 1000
    http.close()
    assert spool_files(tmp_path / "spool") == files and list(read_lines(tmp_path / "spool")) == lines


def _kept(folder, lines) -> str:
    """A role's folder whose ``undelivered/`` holds ``lines`` (what an outage left)."""
    sink = SpoolSink(os.path.join(folder, "undelivered"))
    sink.send(lines)
    sink.close()
    return os.path.dirname(folder)


def test_replay_folders_into_a_dead_server_keeps_every_file_and_counts_it_kept(tmp_path):
    lines = nasty_lines(50)
    session = _kept(tmp_path / "s1" / "agent-h", lines)
    counts = replay_folders(session, dead_url(), "db", HttpOptions(timeout=1))
    assert counts == {"files": 1, "lines": 50, "written": 0, "refused": 0, "kept": 50}
    assert list(read_lines(session)) == lines  # never delete the only copy


def test_replay_folders_writes_every_role_and_leaves_no_stale_reasons(tmp_path, influxd, fresh_db):
    lines = nasty_lines(40)
    session = _kept(tmp_path / "s1" / "agent-h", lines[:20])
    _kept(tmp_path / "s1" / "tcp-10.0.0.1-1", lines[20:])
    refused = tmp_path / "s1" / "agent-h" / "refused"
    refused.mkdir()
    (refused / "reasons.txt").write_text("2026-01-01T00:00:00Z HTTP 400 from an earlier write\n")  # nothing left
    assert replay_folders(session, influxd.url, fresh_db)["written"] == 40
    assert spool_files(session) == [] and not (refused / "reasons.txt").exists()
    assert len(influxd.query("SELECT * FROM spool", db=fresh_db)) == 40


def test_remove_spool_deletes_the_files_and_emptied_folders_but_keeps_what_is_still_written(tmp_path):
    for role in ("agent-h", "scheduler"):
        sink = SpoolSink(tmp_path / "s1" / role)
        sink.send([b"m v=1i 1"])
        sink.close()
    folders = [str(tmp_path / "s1" / "agent-h"), str(tmp_path / "s1" / "scheduler")]
    assert remove_spool(folders, keep=[folders[1]]) == 2
    assert sorted(os.listdir(tmp_path / "s1")) == ["scheduler"]  # kept: still written to
    assert remove_spool(folders) == 0 and not (tmp_path / "s1").exists()
