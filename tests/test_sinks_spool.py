"""SpoolSink: bounded memory, whole lines on disk, private folders, a full disk."""

from __future__ import annotations

import logging
import os
import pathlib
import re
import threading
import time

from dask_influx_metrics import lineparse
from dask_influx_metrics import lineprotocol as lp
from dask_influx_metrics.schema import Point
from dask_influx_metrics.sinks.spool import SpoolSink, read_lines, spool_files

BASE_NS = 1_700_000_000_000_000_000
NASTY = ["plain", "multi\nline", 'quote " and \\', "a=b, c", "\\", "", "x\r\ny"]


def nasty_lines(n, measurement="spool"):
    """Lines whose string values hold raw newlines, quotes and backslashes."""
    return [
        lp.encode(
            Point(
                measurement,
                {"host": "h 1", "k": NASTY[i % 7] or "e"},
                {"s": NASTY[i % 7] + str(i), "i": i},
                BASE_NS + i,
            )
        )
        for i in range(n)
    ]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_memory_never_exceeds_mem_limit(tmp_path, monkeypatch):
    sink = SpoolSink(tmp_path, mem_limit=50, flush_interval=3600)
    peaks = []
    flush = sink._flush
    monkeypatch.setattr(sink, "_flush", lambda: (peaks.append(sink.buffered), flush())[1])
    lines = nasty_lines(1234)
    for size in (1, 7, 49, 50, 51, 333, 743):  # single sends larger than the limit too
        sink.send(lines[:size])
        lines = lines[size:]
        peaks.append(sink.buffered)
    assert max(peaks) <= 50 and sink.points_written + sink.buffered == 1234


def test_files_hold_every_line_in_order_across_rotations(tmp_path):
    lines = nasty_lines(5000)
    sink = SpoolSink(tmp_path / "a" / "b", mem_limit=300, max_file_bytes=64 * 1024)
    for i in range(0, 5000, 123):
        sink.send(lines[i : i + 123])
    sink.close()
    files = spool_files(tmp_path)
    assert len(files) > 5
    assert all(re.fullmatch(r"spool-%d-\d{6}\.lp" % os.getpid(), os.path.basename(f)) for f in files)
    for f in files:
        data = pathlib.Path(f).read_bytes()
        assert data.endswith(b"\n") and (len(data) <= 64 * 1024)
    assert list(read_lines(tmp_path)) == lines
    assert [lineparse.parse(x) for x in read_lines(tmp_path)] == [lineparse.parse(x) for x in lines]
    assert sink.points_written == 5000 and sink.points_dropped == 0


def test_flush_interval_is_checked_on_send(tmp_path):
    clock = Clock()
    sink = SpoolSink(tmp_path, mem_limit=1000, flush_interval=1.0, clock=clock)
    sink.send([b"m v=1i 1"])
    assert sink.buffered == 1 and not spool_files(tmp_path)
    clock.now = 1.5
    sink.send([])
    assert sink.buffered == 0 and list(read_lines(tmp_path)) == [b"m v=1i 1"]
    sink.send([b"m v=2i 2"])
    sink.flush()
    assert list(read_lines(tmp_path)) == [b"m v=1i 1", b"m v=2i 2"]


def test_readers_ignore_an_unterminated_last_line(tmp_path):
    (tmp_path / "spool-1-000000.lp").write_bytes(b'm v=1i 1\nm s="a\nb" 2\nm s="half\nwr')
    assert list(read_lines(tmp_path)) == [b"m v=1i 1", b'm s="a\nb" 2']


def test_a_torn_file_is_never_appended_to(tmp_path):
    sink = SpoolSink(tmp_path, mem_limit=1)
    sink.send([b"m v=1i 1"])
    first = spool_files(tmp_path)[0]
    with open(first, "r+b") as f:
        f.truncate(5)  # as if a write had been cut short
    sink.send([b"m v=2i 2"])
    assert len(spool_files(tmp_path)) == 2 and list(read_lines(tmp_path)) == [b"m v=2i 2"]


def test_an_existing_spool_of_the_same_pid_is_not_overwritten(tmp_path):
    old = tmp_path / ("spool-%d-000004.lp" % os.getpid())
    old.write_bytes(b"old v=1i 1\n")
    sink = SpoolSink(tmp_path, mem_limit=1)
    sink.send([b"new v=1i 1"])
    assert list(read_lines(tmp_path)) == [b"old v=1i 1", b"new v=1i 1"]


def test_disk_errors_drop_and_count_without_raising(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sink = SpoolSink(blocker / "spool", mem_limit=2)
    with caplog.at_level(logging.WARNING, logger="dask_influx_metrics.sinks.spool"):
        for _ in range(3):
            sink.send([b"m v=1i 1", b"m v=2i 2"])
        sink.close()
    assert sink.points_dropped == 6 and sink.buffered == 0
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1


FULL_DISK = """
import json, logging, os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as ENOSPC on a full disk
from dask_influx_metrics.sinks.spool import SpoolSink
directory, limit, flushes, per_flush = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
warnings = []
logging.getLogger("dask_influx_metrics").addHandler(type("H", (logging.Handler,), {"emit": lambda s, r: warnings.append(r.getMessage())})())
sink = SpoolSink(directory, mem_limit=per_flush)
os.makedirs(directory)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
for f in range(flushes):
    sink.send([b"m,n=%03d v=%03di 1700000000000000000" % (f, i) for i in range(per_flush)])  # 38 bytes + newline
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
files = {name: os.path.getsize(os.path.join(directory, name)) for name in sorted(os.listdir(directory))}
print(json.dumps({"written": sink.points_written, "dropped": sink.points_dropped, "files": files, "warnings": warnings}))
"""


def fill_disk(directory, limit, flushes, per_flush) -> dict:
    """A SpoolSink whose files may not grow past ``limit`` bytes (RLIMIT_FSIZE, in a child process)."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(directory), str(limit), str(flushes), str(per_flush)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_a_full_disk_leaves_no_empty_files_and_the_warning_names_the_file_that_failed(tmp_path):
    got = fill_disk(tmp_path / "spool", limit=0, flushes=5, per_flush=10)
    assert (got["written"], got["dropped"]) == (0, 50)
    assert got["files"] == {}  # not one empty file per failed flush
    [warning] = got["warnings"]
    assert "spool-" in warning and "000000.lp" in warning and "File too large" in warning


def test_a_partial_write_counts_the_whole_lines_that_reached_the_disk(tmp_path):
    got = fill_disk(tmp_path / "spool", limit=100, flushes=1, per_flush=10)  # 2 lines and a bit fit
    assert (got["written"], got["dropped"]) == (2, 8)
    [(name, size)] = got["files"].items()
    assert size == 100  # two whole lines, then a torn one that readers ignore and nobody appends to
    assert list(read_lines(tmp_path / "spool")) == [b"m,n=000 v=%03di 1700000000000000000" % i for i in range(2)]


def test_an_idle_sink_reaches_the_disk_within_the_flush_interval(tmp_path):
    """Issue 23 item 2: lines never wait in memory for the next send."""
    sink = SpoolSink(tmp_path, mem_limit=1000, flush_interval=0.2)
    sink.send([b"m v=1i 1"])
    sent = time.monotonic()
    while not list(read_lines(tmp_path)):
        assert time.monotonic() - sent < 2.0, "the line is still in memory"
        time.sleep(0.01)
    assert time.monotonic() - sent < 1.0 and sink.buffered == 0
    timers = [t for t in threading.enumerate() if t.name == "influx-spool-flush"]
    sink.close()
    deadline = time.monotonic() + 2
    while len([t for t in timers if t.is_alive()]) >= len(timers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len([t for t in timers if t.is_alive()]) < len(timers), "close() stops the flush timer"


def test_every_folder_it_creates_is_private(tmp_path):
    """Issue 23 item 9: <root>/<session>/<worker> under a configured spool.directory, all 0700."""
    root = tmp_path / "root"
    sink = SpoolSink(root / "20261121T100000-000001" / "tcp-127.0.0.1-1", flush_interval=0.01)
    sink.send([b"m v=1i 1"])
    sink.close()
    for folder in (root, root / "20261121T100000-000001", root / "20261121T100000-000001" / "tcp-127.0.0.1-1"):
        assert oct(folder.stat().st_mode & 0o777) == "0o700", folder


def test_take_writes_through_and_says_how_many_lines_reached_the_disk(tmp_path):
    """Issue 43 item 3: the agent marks its workers' outboxes sent only as far as the spool took them."""
    sink = SpoolSink(tmp_path / "spool", mem_limit=1000, flush_interval=3600)
    lines = [b"m v=%di %d" % (i, i) for i in range(5)]
    assert sink.take(lines) == 5 and list(read_lines(tmp_path / "spool")) == lines, "on disk at once"
    sink.close()
