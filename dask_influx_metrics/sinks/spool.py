"""Spool sink: line protocol on local disk, for replay into InfluxDB later (:mod:`.replay`), and its readers.

``SpoolSink`` holds at most ``mem_limit`` lines in memory and appends them to
``<directory>/spool-<pid>-<NNNNNN>.lp`` when that many are buffered, at least
every ``flush_interval`` seconds (checked on each ``send``, and by a small
timer thread so that an idle process flushes too: what a killed process loses
is bounded by that interval), on :meth:`SpoolSink.flush` and on ``close``.
Every folder it creates is 0700. A file is rotated
once it would exceed ``max_file_bytes``. Each flush is one ``write`` of whole
newline-terminated lines to a file opened with ``O_APPEND``, so a reader
sees only whole lines plus, at worst, one unterminated last line, which
:func:`read_lines` ignores. If the disk refuses a write, the lines that did
not reach it whole are dropped and counted (memory stays bounded), the
warning names the file, a partly written file is never appended to again,
and a file not one byte reached is removed (a full disk leaves no empty files).
String field values may hold raw newlines, so files are split with
:func:`~dask_influx_metrics.lineparse.split_lines`, never ``bytes.split``.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> sink = SpoolSink(d, mem_limit=2)
>>> sink.send([b"m v=1i 1", b"m v=2i 2", b"m v=3i 3"])
>>> sink.buffered, sink.points_written
(1, 2)
>>> sink.close()
>>> list(read_lines(d))
[b'm v=1i 1', b'm v=2i 2', b'm v=3i 3']
>>> import shutil; shutil.rmtree(d)
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from typing import Iterator

from ..lineparse import split_lines

logger = logging.getLogger(__name__)

SUFFIX = ".lp"
_READ_CHUNK = 1 << 20


def make_private_dirs(path) -> str:
    """Create ``path`` and every missing folder above it with mode 0700 (``os.makedirs`` gives
    ``mode`` to the last one only, so a session folder would be 0755); returns ``path``.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> oct(os.stat(make_private_dirs(os.path.join(d, "s", "w")) + "/..").st_mode & 0o777)
    '0o700'
    >>> import shutil; shutil.rmtree(d)
    """
    path = os.fspath(path)
    missing = []
    here = os.path.abspath(path)
    while not os.path.isdir(here) and os.path.dirname(here) != here:
        missing.append(here)
        here = os.path.dirname(here)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
    return path


def private_folder(path) -> str:
    """Create ``path`` 0700 if missing and return it; ``PermissionError`` naming it when it is not
    a folder of this OS user closed to others (another user could read or plant samples).
    """
    path = os.fspath(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{path!r} is not a private folder of user {os.getuid()} (owner {info.st_uid}, "
            f"mode {stat.filemode(info.st_mode)}); remove it or fix its owner and mode"
        )
    return path


class SpoolSink:
    """Append line protocol to files under ``directory`` (see the module docstring)."""

    def __init__(
        self,
        directory,
        mem_limit: int = 1000,
        flush_interval: float = 1.0,
        max_file_bytes: int = 64 * 2**20,
        clock=time.monotonic,
    ):
        self.directory = os.fspath(directory)
        self.mem_limit = max(1, int(mem_limit))
        self.flush_interval = float(flush_interval)
        self.max_file_bytes = max(1, int(max_file_bytes))
        self.points_written = 0
        self.points_dropped = 0
        self._clock = clock
        self._buffer: list[bytes] = []
        self._last_flush = clock()
        self._pid = None
        self._seq = 0
        self._closed = False
        self._failing = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer_pid = None  # the process whose timer thread flushes (started on the first send)

    @property
    def buffered(self) -> int:
        """Lines in memory, not yet on disk (never more than ``mem_limit``)."""
        return len(self._buffer)

    @property
    def path(self) -> str:
        """The file the next flush appends to."""
        return os.path.join(self.directory, f"spool-{self._pid or os.getpid()}-{self._seq:06d}{SUFFIX}")

    def send(self, lines: list[bytes]) -> None:
        """Buffer ``lines``, writing to disk whenever the buffer fills or is due; never raises."""
        try:
            if self._timer_pid != os.getpid() and not self._closed:
                self._start_timer()
            with self._lock:
                i = 0
                while i < len(lines):
                    room = self.mem_limit - len(self._buffer)
                    self._buffer.extend(lines[i : i + room])
                    i += room
                    if len(self._buffer) >= self.mem_limit:
                        self._flush()
                if self._closed or self._clock() - self._last_flush >= self.flush_interval:
                    self._flush()
        except Exception:
            logger.exception("spool sink: unexpected error in send")

    def take(self, lines: list[bytes]) -> int:
        """Write ``lines`` through to disk now (after what is buffered); how many of them reached it whole. The
        rest stays the caller's, not counted here (an agent's outboxes keep it for the next sample)."""
        try:
            with self._lock:
                self._flush()
                return self._write(lines, count_rest=False) if lines else 0
        except Exception:
            logger.exception("spool sink: unexpected error in take")
            return 0

    def flush(self, drain: float = 0.0) -> None:
        """Write the buffered lines to disk now (nothing is queued beyond them)."""
        with self._lock:
            self._flush()

    def close(self) -> None:
        """Flush and stop the timer. Later sends still work, written straight through."""
        with self._lock:
            self._closed = True
            self._flush()
        self._stop.set()

    def counters(self) -> list[dict]:
        return [{"kind": "spool", "points_written": self.points_written, "points_dropped": self.points_dropped}]

    def delivery(self) -> list[dict]:
        return [{"sink": "spool", "points_sent": self.points_written, "points_dropped": self.points_dropped}]

    def _start_timer(self) -> None:
        """Flush every ``flush_interval`` s from a daemon thread of this process, so lines never
        wait in memory for the next ``send`` (an idle worker, the scheduler's last DAG point)."""
        with self._lock:
            if self._timer_pid == os.getpid():
                return
            self._timer_pid = os.getpid()
            self._stop = threading.Event()  # a forked child gets a fresh one (and a thread of its own)
        threading.Thread(target=self._tick, args=(self._stop,), name="influx-spool-flush", daemon=True).start()

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(self.flush_interval):
            try:
                with self._lock:
                    if self._buffer:
                        self._flush()
            except Exception:
                logger.exception("spool sink: unexpected error in the flush timer")

    def _flush(self) -> None:
        self._last_flush = self._clock()
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        self._write(batch)

    def _write(self, batch: list[bytes], count_rest: bool = True) -> int:
        """Append ``batch``; how many of its lines reached the disk whole (the rest counted as dropped when
        ``count_rest``)."""
        try:
            self._append(b"".join(line + b"\n" for line in batch))
        except OSError as e:
            path, written = self._attempt
            whole = whole_lines(batch, written)
            self.points_written += whole
            if count_rest:
                self.points_dropped += len(batch) - whole
            if written:
                self._seq += 1  # never append after a partial write
            if not self._failing:
                logger.warning("spool sink: cannot write %s (%s); dropping lines until it works", path, e)
                self._failing = True
            return whole
        self.points_written += len(batch)
        self._failing = False
        return len(batch)

    def _append(self, data: bytes) -> None:
        """Append ``data``; ``self._attempt`` says (file, bytes written) if it raises. A file this
        created and could not write a byte to is removed (a full disk leaves no empty files)."""
        self._attempt = (self.path, 0)
        if self._pid != os.getpid():  # first write, or a forked child: never share a file
            make_private_dirs(self.directory)
            self._pid = os.getpid()
            self._seq = _next_sequence(self.directory, self._pid)
        while True:
            path = self.path
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
                if size == 0 or (size + len(data) <= self.max_file_bytes and not torn):
                    view = memoryview(data)
                    self._attempt = (path, 0)
                    try:
                        while view:
                            view = view[os.write(fd, view) :]
                            self._attempt = (path, len(data) - len(view))
                    except OSError:
                        if size == 0 and self._attempt[1] == 0:
                            os.unlink(path)
                        raise
                    return
            finally:
                os.close(fd)
            self._seq += 1  # full, or ends in a torn line: next file


def whole_lines(batch: list[bytes], written: int) -> int:
    """How many of ``batch``'s lines (each written with a newline) lie wholly in the first ``written`` bytes."""
    count = end = 0
    for line in batch:
        end += len(line) + 1
        if end > written:
            break
        count += 1
    return count


def _next_sequence(directory: str, pid: int) -> int:
    pattern = re.compile(rf"spool-{pid}-(\d+){re.escape(SUFFIX)}\Z")
    numbers = [int(m.group(1)) for m in map(pattern.match, os.listdir(directory)) if m]
    return max(numbers) + 1 if numbers else 0


def spool_files(directory) -> list[str]:
    """Every ``*.lp`` file under ``directory`` (recursively), sorted by path.

    >>> spool_files("/nonexistent")
    []
    """
    found = []
    for root, _, files in os.walk(os.fspath(directory)):
        found.extend(os.path.join(root, f) for f in files if f.endswith(SUFFIX))
    return sorted(found)


def file_lines(path: str) -> Iterator[bytes]:
    """Yield every complete line of one spool file."""
    with open(path, "rb") as f:
        rest = b""
        while True:
            chunk = f.read(_READ_CHUNK)
            if not chunk:
                break
            lines, rest = split_lines(rest + chunk)
            yield from lines
    if rest.strip():
        logger.debug("spool: ignoring an unterminated last line in %s", path)


def read_lines(directory) -> Iterator[bytes]:
    """Yield every complete spooled line under ``directory``, file by file, in order."""
    for path in spool_files(directory):
        yield from file_lines(path)
