"""The spool reader on damaged files, and the samples an HTTP outage left in ``undelivered/``."""

from __future__ import annotations

import logging
import os

import pytest

from dask_influx_metrics import lineprotocol, query
from dask_influx_metrics.schema import Point
from dask_influx_metrics.sinks.http import HttpOptions, HttpSink
from dask_influx_metrics.sinks.replay import replay_folders
from dask_influx_metrics.sinks.spool import SpoolSink, read_lines, spool_files

W = "tcp://10.0.0.1:1"
T0 = 1_714_564_800_000_000_000


SID = "20240501T120000-000001"  # the session of every point here (its spool folder's name)


def _lines(n: int, start: int = 0) -> list[bytes]:
    tags = {"host": "h", "worker": W, "job": "1", "dag": "1", "index": "0", "session": SID}
    return lineprotocol.encode_many(
        Point("gpu", tags, {"utilization_gpu": float(k)}, T0 + k * 10**8) for k in range(start, start + n)
    )


def _session(root, lines: list[bytes], torn: bytes = b"") -> str:
    folder = root / "20240501T120000-000001" / "tcp___10.0.0.1_1"
    folder.mkdir(parents=True)
    path = folder / "spool-1-000000.lp"
    path.write_bytes(b"\n".join(lines) + b"\n" + torn)
    return str(path)


def test_a_corrupt_line_is_skipped_counted_and_named(tmp_path, caplog):
    good = _lines(6)
    lines = good[:2] + [b"gpu,host=h utilization_gpu=oops 1", b"\xff\xfe garbage"] + good[2:4] + [b""] + good[4:]
    path = _session(tmp_path, lines, torn=b"gpu,host=h,worker=" + W.encode() + b" utilization_gpu=9")
    with caplog.at_level(logging.WARNING), query.connect(tmp_path) as db:
        table = query.worker_tables(db)[W]
        assert list(table["compute-util[0]"]) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # the torn last line: silently left
        notes = db.notes
    assert len(notes) == 1 and notes[0].startswith("skipped 2 corrupt spool line(s): ")
    assert f"{path}:3: " in notes[0] and f"{path}:4: " in notes[0]  # file:line, blank lines counted
    assert any(f"{path}:3" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_an_unclosed_quote_does_not_swallow_the_lines_after_it(tmp_path):
    good = _lines(4)
    path = _session(tmp_path, good[:1] + [b'gpu,host=h s="never closed 5'] + good[1:])
    with query.connect(tmp_path) as db:
        assert list(query.worker_tables(db)[W]["compute-util[0]"]) == [0.0, 1.0, 2.0, 3.0]
        assert f"{path}:2: " in db.notes[0]


def test_cli_prints_the_notes(tmp_path):
    from click.testing import CliRunner

    from dask_influx_metrics.client.cli import cli

    path = _session(tmp_path, _lines(2) + [b"not line protocol"])
    result = CliRunner().invoke(cli, ["peaks", "compute-util", "--whole", "--source", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"note: skipped 1 corrupt spool line(s): {path}:3: " in result.stderr


def _outage(influxd, db: str, session) -> int:
    """Samples 0-9 delivered; 10-29 sent while the server was unreachable: they land in undelivered/."""
    influxd.write(b"\n".join(_lines(10)), db=db)
    undelivered = session / "tcp-10.0.0.1-1" / "undelivered"
    sink = HttpSink(
        "http://127.0.0.1:1", db, HttpOptions(timeout=1, flush_interval=0.05), fallback=SpoolSink(undelivered)
    )
    sink.send(_lines(20, start=10))
    sink.close()
    assert sink.points_failed == 20
    return len(spool_files(undelivered))


def test_reading_never_writes_undelivered_samples_it_names_them_and_a_replay_writes_them(influxd, fresh_db, tmp_path):
    session = tmp_path / "20240501T120000-000001"
    assert _outage(influxd, fresh_db, session) >= 1
    undelivered = session / "tcp-10.0.0.1-1" / "undelivered"
    with query.connect(influxd.url, fresh_db, undelivered=session) as db:
        assert query.get_peaks(db, "compute-util", per_job=False) == [[9]]  # the outage is missing, and said so
        assert db.notes == [
            f"20 sample(s) under {undelivered} are not in InfluxDB (not delivered over HTTP at "
            f"the time); write them with `dask-influx-metrics replay {session} --source URL`"
        ]
        assert len(spool_files(session)) >= 1  # reading deleted nothing
        assert not hasattr(db, "replay_undelivered")  # the read side only reads
    assert replay_folders(session, influxd.url, fresh_db) == {
        "files": 1,
        "lines": 20,
        "written": 20,
        "refused": 0,
        "kept": 0,
    }
    assert spool_files(session) == []  # written: removed, never replayed twice
    with query.connect(influxd.url, fresh_db, undelivered=session) as db:
        assert db.notes == [] and len(query.worker_tables(db)[W]) == 30
        assert query.get_peaks(db, "compute-util", per_job=False) == [[29]]


def test_a_partial_write_stays_refused_on_disk_until_a_replay_writes_it(influxd, fresh_db, tmp_path):
    """Issue 23 item 1: a foreign string in gpu.utilization_gpu makes every batch a 400 partial write."""
    influxd.write(b'gpu,host=other utilization_gpu="foreign" %d' % (T0 - 1), db=fresh_db)  # the same shard
    session = tmp_path / "20240501T120000-000001"
    role = session / "tcp-10.0.0.1-1"
    sink = HttpSink(
        influxd.url,
        fresh_db,
        HttpOptions(flush_interval=0.05),
        fallback=SpoolSink(role / "undelivered"),
        refused=role / "refused",
    )
    lines = _lines(30) + [b"host,host=h,session=%s,worker=%s cpu_percent=5.0 %d" % (SID.encode(), W.encode(), T0)]
    sink.send(lines)
    sink.close()
    assert (sink.points_written, sink.points_refused, sink.points_failed) == (1, 30, 0)
    refused = role / "refused"
    assert list(read_lines(refused)) == lines[:30]
    with query.connect(influxd.url, fresh_db, undelivered=session) as db:
        # the session read, named: the foreign point has no session id (one "unnamed" session, older)
        assert f"read session '{SID}', the latest of 2" in db.notes[0]
        assert "30 sample(s) under " + str(refused) in db.notes[-1]
        assert "InfluxDB refused them; its reasons: " + str(refused / "reasons.txt") in db.notes[-1]
    again = replay_folders(session, influxd.url, fresh_db)  # the conflict is still there: nothing is lost
    assert again == {"files": 1, "lines": 30, "written": 0, "refused": 30, "kept": 0}
    assert sorted(read_lines(refused)) == sorted(lines[:30])
    with query.connect(influxd.url, fresh_db, undelivered=session) as db:
        assert len([n for n in db.notes if "sample(s) under" in n]) == 1
    influxd.query("DROP MEASUREMENT gpu", db=fresh_db)  # the foreign point goes, and its field type with it
    assert replay_folders(session, influxd.url, fresh_db)["written"] == 30
    with query.connect(influxd.url, fresh_db, undelivered=session) as db:
        assert query.get_peaks(db, "compute-util", per_job=False) == [[29]]
        assert not any("sample(s) under" in n for n in db.notes)
    assert spool_files(session) == [] and not (refused / "reasons.txt").exists()


def test_cli_replay_writes_the_undelivered_samples(influxd, fresh_db, tmp_path):
    from click.testing import CliRunner

    from dask_influx_metrics.client.cli import cli

    session = tmp_path / "20240501T120000-000001"
    _outage(influxd, fresh_db, session)
    result = CliRunner().invoke(
        cli, ["replay", str(session), "--source", influxd.url, "--database", fresh_db, "--format", "csv"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["files,lines,written,refused,kept", "1,20,20,0,0"]
    assert spool_files(session) == []
    _session(tmp_path / "spool", _lines(2))
    result = CliRunner().invoke(cli, ["replay", str(session), "--source", str(tmp_path / "spool")])
    assert result.exit_code == 2 and result.stderr == (
        f"error: replay writes into InfluxDB (an http(s):// URL as --source), not {str(tmp_path / 'spool')!r}\n"
    )


def test_the_spool_reader_counts_undelivered_samples(influxd, fresh_db, tmp_path):
    session = tmp_path / "20240501T120000-000001"
    _outage(influxd, fresh_db, session)
    with query.connect(tmp_path) as db:
        assert len(query.worker_tables(db)[W]) == 20
        assert db.notes == ["20 sample(s) came from undelivered/ (not delivered over HTTP at the time)"]


def test_undelivered_needs_an_influxdb_source(tmp_path):
    with pytest.raises(ValueError, match="undelivered= names samples not in InfluxDB"):
        query.connect(tmp_path, undelivered=os.fspath(tmp_path))


def test_the_spool_reader_reads_refused_samples_once(tmp_path):
    """refused/ holds the only copy with the http sink alone, a second one beside a spool sink's own files."""
    session = tmp_path / "20240501T120000-000001"
    alone = session / "tcp-10.0.0.1-1" / "refused"
    sink = SpoolSink(alone)
    sink.send(_lines(5))
    sink.close()
    with query.connect(tmp_path) as db:
        assert len(query.worker_tables(db)[W]) == 5
        assert db.notes == [
            "5 sample(s) came from refused/ (InfluxDB refused them; its reasons are in refused/reasons.txt)"
        ]
    beside = SpoolSink(session / "tcp-10.0.0.1-1")
    beside.send(_lines(5))
    beside.close()
    with query.connect(tmp_path) as db:
        assert len(query.worker_tables(db)[W]) == 5 and db.notes == []


def _undelivered_only(session, workers) -> None:
    """A session an HTTP sink left behind during an outage: ``<worker>/undelivered/*.lp`` only."""
    for w, worker in enumerate(workers):
        lines = [line.replace(W.encode(), worker.encode()) for line in _lines(5, start=10 * w)]
        sink = SpoolSink(session / f"tcp-10.0.0.{w + 1}-1" / "undelivered")
        sink.send(lines)
        sink.close()


def test_a_session_folder_of_undelivered_samples_reads_every_worker(tmp_path):
    """Issue 24: the session folder was taken for a spool root and one worker folder for its session."""
    workers = [W, "tcp://10.0.0.2:1"]
    session = tmp_path / "20240501T120000-000001"
    _undelivered_only(session, workers)
    with query.connect(session) as db:
        assert db.workers() == workers
        assert query.get_peaks(db, "compute-util", per_job=False) == [[4], [14]]
    with query.connect(tmp_path) as db:  # the root: its one session
        assert db.workers() == workers and db.notes == [
            "10 sample(s) came from undelivered/ (not delivered over HTTP at the time)"
        ]


def test_a_spool_root_read_without_a_session_says_which_one(tmp_path):
    older, newer = tmp_path / "20240501T120000-000001", tmp_path / "20240502T120000-000002"
    _undelivered_only(older, [W])
    _undelivered_only(newer, [W])
    note = (
        f"read session '{newer.name}', the latest of 2 in spool root '{tmp_path}' (the 1 other(s), newest first: "
        f"['{older.name}']); choose with session= (CLI: --session): an id, an index from the latest (2 = the one "
        'before), or "all"'
    )
    with query.connect(tmp_path) as db:
        assert db.notes[0] == note
    with query.connect(tmp_path, session=older.name) as db:
        assert not any("latest" in n for n in db.notes)
    from click.testing import CliRunner

    from dask_influx_metrics.client.cli import cli

    result = CliRunner().invoke(cli, ["workers", "--source", str(tmp_path)])
    assert result.exit_code == 0 and f"note: {note}" in result.stderr
