"""An HTTP sink's undelivered copy, written first: lines are on disk before InfluxDB has them, and leave the
disk once it has.

The folder is the sender's ``undelivered/`` (:mod:`.paths`). :meth:`Journal.append` writes lines through to
its current file (``spool-<pid>-<seq>.lp``, the spool's format: every reader and ``replay`` read it as they
read the spool); the HTTP sink's thread :meth:`~Journal.ready` seals the current file once it holds a batch
or is ``flush_interval`` old, posts the sealed files oldest first (:meth:`~Journal.oldest`) and removes each
once InfluxDB has its lines (:meth:`~Journal.done`; what it refused is kept in ``refused/``). So the folder
holds what InfluxDB does not have yet, plus the file being posted: an outage leaves its files there and they
go, in order, when the server answers again; the next agent of a killed one finds its files and posts them
first. A file is posted twice only if its poster dies between InfluxDB's answer and the removal (InfluxDB
keeps one point per series and time: the same point twice is one).

>>> import tempfile; d = tempfile.mkdtemp()
>>> j = Journal(d, max_lines=2)
>>> j.append([b"m v=1i 1", b"m v=2i 2", b"m v=3i 3"]), j.backlog  # a full file is sealed at once
(3, 3)
>>> path, lines = j.oldest(); lines
[b'm v=1i 1', b'm v=2i 2', b'm v=3i 3']
>>> j.done(path); j.backlog, j.oldest()
(0, None)
>>> import shutil; shutil.rmtree(d)
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time

from ..lineparse import split_lines
from .http import HttpOptions, HttpSink
from .spool import SUFFIX, make_private_dirs, whole_lines

logger = logging.getLogger(__name__)


class Journal:
    """Lines on their way to InfluxDB, in files under ``directory`` (see the module docstring); a file holds
    about ``max_lines`` (an HTTP batch)."""

    def __init__(self, directory, max_lines: int, clock=time.monotonic):
        self.directory, self.max_lines, self._clock = os.fspath(directory), max(1, int(max_lines)), clock
        self._lock = threading.Lock()
        self._sealed: collections.deque = collections.deque()  # (path, lines) to post, oldest first
        self._fd = self._path = None
        self._lines = 0  # in the current file
        self._since = 0.0  # when its first line was written
        self._seq = 0
        self.backlog = 0  # lines in sealed files
        self.adopted = self._adopt()  # lines a process that died left here

    def _adopt(self) -> int:
        """Files a process of this sender left (killed, or closed while the server was down): posted first, in
        the order they were written."""
        try:
            names = [n for n in os.listdir(self.directory) if n.endswith(SUFFIX)]
        except OSError:  # none yet (or no folder can be made there: nothing is kept on disk then)
            return 0
        paths = [os.path.join(self.directory, n) for n in names]
        for path in sorted(paths, key=lambda p: (os.stat(p).st_mtime_ns, p)):
            lines = len(_read(path))
            self._sealed.append((path, lines))
            self.backlog += lines
        return self.backlog

    def append(self, lines: list[bytes]) -> int:
        """Write ``lines`` through to the current file; how many reached it whole (a full disk: the rest did
        not, and no line is left cut: the next write starts on a line boundary)."""
        if not lines:
            return 0
        data = b"".join(line + b"\n" for line in lines)
        with self._lock:
            try:
                if self._fd is not None and os.fstat(self._fd).st_nlink == 0:  # removed (clear_metrics): a new one
                    os.close(self._fd)
                    self._fd, self._lines = None, 0
                if self._fd is None:
                    self._open()
            except OSError:
                return 0
            done = 0
            try:
                while done < len(data):
                    done += os.write(self._fd, memoryview(data)[done:])
            except OSError:
                whole = _whole_bytes(lines, done)
                if whole < done:
                    try:
                        os.ftruncate(self._fd, os.fstat(self._fd).st_size - (done - whole))
                    except OSError:  # the torn line stays: readers leave it out, the poster too
                        pass
                done = whole
            written = len(lines) if done == len(data) else whole_lines(lines, done)
            if not written and not self._lines:  # nothing in it: no empty file left on a full disk
                self._discard()
                return 0
            if written and not self._lines:
                self._since = self._clock()
            self._lines += written
            if self._lines >= self.max_lines:
                self._seal()
            return written

    def ready(self, age: float, now: bool = False) -> bool:
        """Whether a file waits to be posted: a sealed one, or the current one once it is ``age`` s old (or
        ``now``), which is sealed then."""
        with self._lock:
            if not self._sealed and self._lines and (now or self._clock() - self._since >= age):
                self._seal()
            return bool(self._sealed)

    def due_in(self, age: float) -> float | None:
        """Seconds until a file is :meth:`ready` (None: nothing to post until lines come)."""
        with self._lock:
            if self._sealed:
                return 0.0
            return max(0.0, self._since + age - self._clock()) if self._lines else None

    @property
    def pending(self) -> int:
        """Lines not posted yet: the sealed files' and the current one's."""
        return self.backlog + self._lines

    def oldest(self) -> tuple[str, list[bytes]] | None:
        """The oldest sealed file and its whole lines (a torn last line of a killed writer is left out)."""
        with self._lock:
            if not self._sealed:
                return None
            path = self._sealed[0][0]
        return path, _read(path)

    def done(self, path: str, rest: list[bytes] = ()) -> None:
        """``path`` was posted: removed; or, with ``rest``, only those of its lines are left to post."""
        with self._lock:
            if not self._sealed or self._sealed[0][0] != path:
                return
            _, lines = self._sealed.popleft()
            self.backlog -= lines
            if rest:
                tmp = path + ".new"
                with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                    f.write(b"".join(line + b"\n" for line in rest))
                os.replace(tmp, path)
                self._sealed.appendleft((path, len(rest)))
                self.backlog += len(rest)
                return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Close the current file (left for the next process, or ``replay``, if it holds lines)."""
        with self._lock:
            if self._lines:
                self._seal()
            elif self._fd is not None:
                self._discard()

    def _open(self) -> None:
        make_private_dirs(self.directory)
        while True:
            self._seq += 1
            self._path = os.path.join(self.directory, f"spool-{os.getpid()}-{self._seq:06d}{SUFFIX}")
            try:
                self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
                return
            except FileExistsError:  # a predecessor of the same pid (another PID namespace) wrote it
                continue

    def _seal(self) -> None:
        os.close(self._fd)
        self._sealed.append((self._path, self._lines))
        self.backlog += self._lines
        self._fd = self._path = None
        self._lines = 0

    def _discard(self) -> None:
        os.close(self._fd)
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        self._fd = self._path = None


def _whole_bytes(lines: list[bytes], size: int) -> int:
    """Where the last of ``lines`` that lies wholly in the first ``size`` bytes ends."""
    return sum(len(line) + 1 for line in lines[: whole_lines(lines, size)])


def _read(path: str) -> list[bytes]:
    try:
        with open(path, "rb") as f:
            return split_lines(f.read())[0]
    except FileNotFoundError:
        return []


class JournaledHttpSink(HttpSink):
    """An :class:`~.http.HttpSink` whose queue is a :class:`Journal` in ``journal`` (the sender's ``undelivered/``
    folder): every line is on disk before it is posted, posted from there, and the same file again after a
    failure (the back-off between tries), so an outage or a killed sender leaves its lines there and they go by
    themselves, in order, once the server answers (:meth:`take` says how many the disk took: the host's agent
    marks its workers' outboxes sent only that far). What the disk refuses is posted from memory (at most
    ``max_pending`` lines), lost and counted if that fails too. ``report(what, message, **details)``: how the
    start and the end of sending what an outage left are said."""

    def __init__(self, url: str, database: str, options: HttpOptions = HttpOptions(), *, journal, report=None, **kw):
        self.journal = Journal(journal, options.batch_size)
        self.points_kept = 0  # lines whose post failed: kept in the journal, posted again later
        self._counted: set = set()  # journal files whose failed lines are counted in points_kept
        self._replaying = 0  # lines kept during an outage (or by a dead predecessor), being sent now
        self._report = report
        super().__init__(url, database, options, **kw)

    @property
    def pending(self) -> int:
        """Lines not posted yet: the journal's, and those its disk refused."""
        return len(self._buffer) + self.journal.pending

    def take(self, lines: list[bytes]) -> int:
        """Write ``lines`` to the journal; how many reached it (the rest is the caller's, not counted)."""
        idle = not self.journal.pending  # the poster waits for a first line; else it wakes when a file is due
        try:
            taken = self.journal.append(lines)
        except Exception:
            logger.exception("HTTP sink: unexpected error in take")
            return 0
        if idle or self.journal.backlog:
            with self._cond:
                self._cond.notify()
        return taken

    def send(self, lines: list[bytes]) -> None:
        """Write ``lines`` to the journal; what its disk refuses is posted from memory (counted if lost)."""
        taken = self.take(lines) if lines else 0
        if taken < len(lines):
            self._unjournaled(lines[taken:])

    def _run(self) -> None:
        """What the disk refused first (posted once), then the journal's files, oldest first, one request at a
        time; after a failure the same file again once the back-off has passed."""
        journal = self.journal
        if journal.adopted:
            self._replay_starts(journal.adopted, "left by a process of this sender that stopped")
        while True:
            with self._cond:
                while True:
                    down = self._down_until - time.monotonic()
                    now = bool(self._draining) or self._stopping
                    if down <= 0 and (self._buffer or journal.ready(self.flush_interval, now=now)):
                        break
                    if self._stopping:  # what is left stays in the journal: the next process, or replay
                        return
                    self._cond.wait(down if down > 0 else journal.due_in(self.flush_interval))
                memory, self._buffer = self._buffer[: self.batch_size], self._buffer[self.batch_size :]
                self._busy = True
            try:
                self._post_memory(memory) if memory else self._post_oldest()
            except Exception:  # never let the thread die: the journal still holds the lines
                logger.exception("HTTP sink: unexpected error while posting")
                self._back_off()
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _post_oldest(self) -> None:
        journal = self.journal
        path, lines = journal.oldest()
        again = path in self._counted  # its post failed before: the server answers again?
        failed = []
        for i in range(0, len(lines), self.batch_size):
            failed = self._post(lines[i : i + self.batch_size])
            if failed:
                failed += lines[i + self.batch_size :]
                break
        journal.done(path, failed)
        if failed:
            self._kept(path, failed)
            return
        self._counted.discard(path)
        if again and not self._replaying:
            self._replay_starts(len(lines) + journal.backlog, "kept while it did not answer")
        if self._replaying and not journal.backlog:
            self._replay_ends()

    def _post_memory(self, lines: list[bytes]) -> None:
        failed = self._post(lines)
        if failed:
            with self._stats_lock:
                self.points_lost += len(failed)
            logger.warning("HTTP sink: %s; %d line(s) that no disk took are LOST", self._why, len(failed))

    def _unjournaled(self, lines: list[bytes]) -> None:
        with self._cond:
            room = max(0, self.max_pending - len(self._buffer))
            self._buffer.extend(lines[:room])
            self._cond.notify()
        if len(lines) > room:
            with self._stats_lock:
                self.points_lost += len(lines) - room
            logger.warning(
                "HTTP sink: the undelivered copy's disk and the queue are full: %d line(s) LOST", len(lines) - room
            )

    def _kept(self, path: str, failed: list[bytes]) -> None:
        """A post failed: its lines stay in the journal (counted once per file), tried again after the back-off
        (a 4xx not about the data too, e.g. no database and none could be created: no request loop)."""
        if time.monotonic() >= self._down_until:
            self._back_off()
        if path not in self._counted:
            self._counted.add(path)
            with self._stats_lock:
                self.points_failed += len(failed)
                self.points_kept += len(failed)
        new = self._kind != self._failure
        self._failure = self._kind
        (logger.warning if new else logger.debug)(
            "HTTP sink: %s; the lines wait in %s and are sent when it answers", self._why, self.journal.directory
        )

    def _replay_starts(self, lines: int, why: str) -> None:
        self._replaying = lines
        self._say(
            "http-replay",
            f"sending the {lines} line(s) {why} ({self.journal.directory}) to {self.url}, oldest first, "
            f"one request of at most {self.batch_size} lines at a time",
            lines=lines,
        )

    def _replay_ends(self) -> None:
        lines, self._replaying = self._replaying, 0
        self._say(
            "http-replayed",
            f"the {lines} line(s) kept in {self.journal.directory} are in InfluxDB ({self.url}); nothing waits there",
            lines=lines,
        )

    def _say(self, what: str, message: str, **details) -> None:
        logger.info("HTTP sink: %s", message)
        if self._report is not None:
            try:
                self._report(what, message, **details)
            except Exception:  # the event is a courtesy; the log line is the record
                pass

    def _waiting(self) -> bool:
        return time.monotonic() < self._down_until  # the server does not answer: the lines wait on disk

    def close(self, wait: float | None = None) -> None:
        """Post what it can (at most ``wait`` s), stop; what was not posted stays in the journal."""
        left = self._stop(wait)
        self.journal.close()
        if left:
            with self._stats_lock:
                self.points_lost += len(left)
        if self._refused is not None:
            self._refused.close()

    @property
    def points_spooled(self) -> int:
        """Lines whose post failed and that waited in the journal (posted again when the server answered)."""
        return self.points_kept

    def counters(self) -> list[dict]:
        return [{**c, "points_lost": self.points_lost, "backlog": self.journal.backlog} for c in super().counters()]
