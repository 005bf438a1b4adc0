"""A worker's outbox: the points only it can make, handed to its host's agent, the host's one sender.

Custom metrics, the task stream and the fine performance metrics need the
worker object, so the worker makes those points; it does not send them. As in
prometheus_client's ``multiprocess`` mode (one file per process, one reader that
merges), each worker appends their line protocol to files of its own in the
session's run folder (:mod:`.runfolder`), ``workers/<id>.out-<k>``, segments of
a quarter of its budget; the agent reads what is new at each sample, hands it to
its one sink, and records how far the sink took it (sent, or on disk) in
``workers/<id>.sent``. A segment the agent has sent whole, once the next one
exists, is removed.

Nothing is lost: the files outlive a worker killed between its write and the
agent's send (the agent drains them before it forgets the worker), and a new
agent resumes from ``.sent`` where a replaced one stopped. A point is sent twice
only if an agent dies between its send and its note of it (InfluxDB keeps one
point per series and time: the same point twice is one).

The run folder is memory (``/dev/shm``), shared with the work the monitor watches.
An outbox holds at most ``budget`` bytes there (segments the agent has not removed);
a segment that cannot grow (the file system is full) is cut back to its last whole
line and closed, and the next one is made in ``spill``, a folder on disk (the
spool's), as is every segment while the budget is used (an agent far behind, or
gone); once a second the writer looks whether the run folder has room again and
goes back. Each move is said once (``report``); points that neither folder takes
are counted (``points_dropped``) and reported with their number. The agent reads
a segment from whichever folder holds it.

An idle worker costs its agent no system call: the writer counts its writes in the
``.sent`` file too (mapped by both), and the agent looks at its files only when that
count changed since its last look (or a take left lines or half a line behind, or
the writer may have died between a write and its count: :attr:`OutboxReader.trust`).

Example
-------
>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> out = Outbox(folder, "w1", segment_bytes=16)
>>> out.send([b"m v=1i 1", b"m v=2i 2"]); out.send([b"m v=3i 3"])
2
1
>>> reader = OutboxReader(folder, "w1")
>>> reader.take()
[b'm v=1i 1', b'm v=2i 2', b'm v=3i 3']
>>> reader.sent(); reader.take(), sorted(os.listdir(folder))
([], ['w1.out-1', 'w1.sent'])
>>> OutboxReader(folder, "w1").take()  # a new agent resumes where the last one stopped
[]
>>> out.close(); reader.remove(); os.listdir(folder)
[]
>>> os.rmdir(folder)
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from typing import Callable

from ..sinks.spool import make_private_dirs

logger = logging.getLogger(__name__)

SEGMENT_BYTES = 1 << 20  # without a budget
BUDGET_BYTES = 1 << 20  # the setting run.outbox-budget's default
TAKE_BYTES = 256 << 10  # what one take hands out at most: a backlog goes out over several samples, not in one burst
LOOK_S = 1.0  # how often a writer whose segment is on disk looks whether the run folder has room again
_LF = b"\x0c"  # a raw newline inside a string field, in the files: the encoder never writes a form feed
STALE = "stale-"  # the prefix of an outbox moved here from a session whose processes are all gone
_SENT = struct.Struct("<QQ")  # segment, offset: how far the agent sent (it writes them)
_WRITES = struct.Struct("<Q")  # after them: the writes the worker made (it counts them)
MARKER_BYTES = _SENT.size + _WRITES.size  # the ``.sent`` file


def _segment(folder: str, worker_id: str, k: int) -> str:
    return os.path.join(folder, f"{worker_id}.out-{k}")


def _free(folder: str) -> int:
    """Bytes the file system of ``folder`` has free for this user (a lot, when it cannot say)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


class Outbox:
    """The worker's side: a sink (:class:`~.sinks.base.Sink`) whose ``send(lines)`` appends them to its
    current segment (one writer) and returns how many it wrote. ``budget``: the bytes it may hold in
    ``folder``; ``spill``: the folder on disk for the rest (None: there is none); ``report(what, message,
    **details)``: how a move or a loss is said."""

    def __init__(
        self,
        folder: str,
        worker_id: str,
        segment_bytes: int | None = None,
        budget: int | None = None,
        spill: str | None = None,
        report: Callable | None = None,
        clock=time.monotonic,
    ):
        self._folder, self._id, self._spill = folder, worker_id, spill
        self._budget = budget or 1 << 62
        self._limit = segment_bytes or (max(4096, budget // 4) if budget else SEGMENT_BYTES)
        self._report, self._clock = report, clock
        self._k, self._fd, self._size, self._where = -1, None, 0, folder
        self._held: dict[int, int] = {}  # k -> bytes of this outbox's segments in the run folder
        self._look_at = 0.0
        self.points_written = self.points_dropped = self.points_spilled = 0
        self._losing = -1  # points lost since the last report of a loss; -1: none lost (or said and over)
        # The agent notes its progress in this file with one pwrite: made whole now, so that never needs room
        # (nor does a look at the writes counted after it, through a mapping: its page is there).
        self._marker = os.path.join(folder, f"{worker_id}.sent")
        fd = os.open(self._marker, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if (size := os.fstat(fd).st_size) < MARKER_BYTES:  # the agent's note of an older outbox of this id kept
                start = size if size >= _SENT.size else 0
                os.pwrite(fd, bytes(MARKER_BYTES - start), start)
            self._shared = mmap.mmap(fd, MARKER_BYTES)
        finally:
            os.close(fd)
        self._writes = _WRITES.unpack_from(self._shared, _SENT.size)[0]
        self._next(folder)

    def _next(self, where: str) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._k += 1
        self._size, self._where = 0, where
        if where == self._folder:
            self._held[self._k] = 0
        self._fd = os.open(_segment(where, self._id, self._k), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def send(self, lines: list[bytes]) -> int:
        if not lines:
            return 0
        payload = b"\n".join(lines) + b"\n"
        if payload.count(b"\n") != len(lines):  # a string field holds a newline: one line, one newline in the file
            payload = b"\n".join(line.replace(b"\n", _LF) for line in lines) + b"\n"
        if self._where != self._folder and self._clock() >= self._look_at:
            self._look_at = self._clock() + LOOK_S
            if self._no_room() is None:
                self._rotate(self._folder)
        where = self._where
        done, error = self._write(payload)
        spilled = payload.count(b"\n", 0, done) if where != self._folder else 0
        if error is not None:  # this segment cannot grow: closed; the rest goes to the next one, where there is room
            target = self._folder if self._no_room() is None else self._spill
            if target is not None and (target != self._where or self._size):
                self._rotate(target, f"it is full ({error.strerror})")
                more, error = self._write(payload[done:])
                spilled += payload.count(b"\n", done, done + more) if self._where != self._folder else 0
                done += more
        written = payload.count(b"\n", 0, done)
        self.points_written += written
        self.points_spilled += spilled
        if written < len(lines):
            self._lost(len(lines) - written, error)
        elif self._losing >= 0:
            self._found_room()
        if self._size >= self._limit:
            why = self._no_room()
            self._rotate(self._folder if why is None else (self._spill or self._folder), why)
        self._counted()
        return written

    def _counted(self) -> None:
        """A write (and any new segment) is in the files: counted after it, where the agent looks first."""
        self._writes += 1
        _WRITES.pack_into(self._shared, _SENT.size, self._writes)

    def _write(self, data: bytes) -> tuple[int, OSError | None]:
        """Append ``data`` (whole lines); returns the bytes written up to the last whole line and the error that
        stopped it, if any. A line cut short is cut off the file: the agent reads whole lines only, and the next
        write starts on a line boundary."""
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                done += os.write(self._fd, view[done:])
        except OSError as e:
            whole = data.rfind(b"\n", 0, done) + 1
            if whole < done:
                try:
                    os.ftruncate(self._fd, self._size + whole)
                except OSError:  # cannot even shrink it: the reader waits for a newline that never comes here
                    pass
            self._grew(whole)
            return whole, e
        self._grew(done)
        return done, None

    def _grew(self, n: int) -> None:
        self._size += n
        if self._where == self._folder:
            self._held[self._k] = self._size

    def _no_room(self) -> str | None:
        """Why a new segment does not fit in the run folder (None: it does): this outbox's budget (what the
        agent has not removed yet), or the file system's free space."""
        try:
            with open(self._marker, "rb") as f:
                sent = _SENT.unpack(f.read(_SENT.size))[0]
        except (OSError, struct.error):
            sent = 0
        for k in [k for k in self._held if k < sent]:  # removed by the agent
            del self._held[k]
        if sum(self._held.values()) + self._limit > self._budget:
            return f"this worker's outbox holds its budget of {self._budget} bytes there (its agent is behind or gone)"
        if (free := _free(self._folder)) < self._limit:
            return f"it is full ({free} bytes free)"
        return None

    def _rotate(self, where: str | None, why: str | None = None) -> None:
        """Close the current segment; the next one in ``where`` (the run folder, or the spill folder on disk:
        ``why``)."""
        where = where or self._folder
        was = self._where
        if where != self._folder:
            try:
                make_private_dirs(where)
            except OSError as e:
                logger.debug("influx-metrics outbox %s: %s", self._id, e)
                where = self._folder
        try:
            self._next(where)
        except OSError as e:  # not even an empty file: the next write says so
            logger.debug("influx-metrics outbox %s: %s", self._id, e)
            return
        if where == was:
            return
        if where == self._folder:
            message = (
                f"the run folder {self._folder} has room again: this worker's outbox is back there "
                f"({self.points_spilled} point(s) went through {was} meanwhile)"
            )
        else:
            message = (
                f"no room for this worker's outbox in the run folder {self._folder}: {why}; its points go to "
                f"{where} until there is"
            )
        self._say("outbox", message, folder=where)

    def _lost(self, n: int, error: OSError | None) -> None:
        self.points_dropped += n
        where = f"neither {self._folder} nor {self._spill}" if self._spill else f"not {self._folder}"
        why = error.strerror if error is not None else "no room"
        if self._losing < 0:
            self._losing = 0
            self._say(
                "outbox-lost",
                f"{n} point(s) of this worker (task stream, custom metrics) lost: {where} had room ({why}); "
                "more are lost and counted until one has",
                points=n,
            )
        else:
            self._losing += n

    def _found_room(self) -> None:
        """The points lost since the last report, said now that a write went through again."""
        n, self._losing = self._losing, -1
        self._say(
            "outbox-lost",
            f"{n} more point(s) of this worker lost while its outbox had no room; "
            f"{self.points_dropped} in all this session; writing again",
            points=n,
        )

    def _say(self, what: str, message: str, **details) -> None:
        if self._report is not None:
            self._report(what, message, **details)
        else:
            logger.warning("influx-metrics: %s", message)

    take = send  # the sink protocol's: what it wrote is what it has

    def flush(self, drain: float = 0.0) -> None:
        """Nothing to do: each send is written through to the segment the agent reads."""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._shared.closed:
            self._shared.close()
        if self._losing > 0:  # the count since the last report: the record stays whole
            self._found_room()

    def counters(self) -> list[dict]:
        return [
            {
                "kind": "outbox",
                "points_written": self.points_written,
                "points_spilled": self.points_spilled,
                "points_dropped": self.points_dropped,
            }
        ]

    def delivery(self) -> list[dict]:
        return []  # the host's agent sends these lines, counted in its own sink's delivery points


class OutboxReader:
    """The agent's side for one worker: :meth:`take` what is new, :meth:`sent` once the sink has it. ``spill``:
    the worker's folder on disk for segments the run folder had no room for."""

    def __init__(self, folder: str, worker_id: str, spill: str | None = None):
        self._folder, self._id, self._spill = folder, worker_id, spill
        self._marker = os.path.join(folder, f"{worker_id}.sent")
        self._k, self._offset, self._writes = 0, 0, None  # nothing sent yet; the writes it counts: not mapped
        try:
            with open(self._marker, "rb") as f:
                self._k, self._offset = _SENT.unpack(f.read(_SENT.size))
                if os.fstat(f.fileno()).st_size >= MARKER_BYTES:  # (an older writer's counts nothing)
                    self._writes = mmap.mmap(f.fileno(), MARKER_BYTES, access=mmap.ACCESS_READ)
        except (OSError, ValueError, struct.error):
            pass
        self._taken = (self._k, self._offset)  # where the lines handed out end
        self._parts: list = []  # (segment, offset, lines) of the last take, for a sink that took only some
        self.behind = False  # the last take left lines for the next
        self.trust = True  # the writer's count says when to look: it lives (see the module docstring)
        self._looked: int | None = None  # the writer's count at the last look at the files
        self._half = False  # the last take left half a line: its end comes
        self._fd = None
        self._failed = False

    def _paths(self, k: int) -> tuple[str, ...]:
        run = _segment(self._folder, self._id, k)
        return (run,) if self._spill is None else (run, _segment(self._spill, self._id, k))

    def _exists(self, k: int) -> bool:
        return any(os.path.exists(p) for p in self._paths(k))

    def take(self, limit: int = TAKE_BYTES) -> list[bytes]:
        """The whole lines written since the last :meth:`take` (this segment, then the next ones), about
        ``limit`` bytes at most (at least one line): a backlog (a replaced agent's, a dead session's) goes out
        over the next samples instead of in one burst that a Telegraf's socket would drop in part."""
        self._parts = []
        if self._writes is not None:
            writes = _WRITES.unpack_from(self._writes, _SENT.size)[0]  # before the files: what it counts is there
            if writes == self._looked and self.trust and not (self.behind or self._half):
                return []  # nothing written since the last look
            self._looked = writes
        k, offset = self._taken
        lines: list[bytes] = []
        self.behind = self._half = False
        while True:
            if limit <= 0:  # a long line used it up: the next segment waits for the next take
                self.behind = True
                break
            want = limit
            data = self._read(k, offset, want)
            while len(data) == want and b"\n" not in data:  # one line longer than what is left: take it whole
                want *= 2
                data = self._read(k, offset, want)
            end = data.rfind(b"\n") + 1
            self._half = end < len(data)
            if end:
                chunk = data[: end - 1].split(b"\n")
                self._parts.append((k, offset, chunk))
                lines += [line.replace(_LF, b"\n") for line in chunk] if _LF in data else chunk
                offset += end
                limit -= end
            if len(data) == want:  # there is more than this take hands out
                self.behind = True
            elif end == len(data) and self._exists(k + 1):
                if self._read(k, offset, 1):  # the writer finished this segment after our read
                    continue
                k, offset = k + 1, 0  # it is done with this one: on to the next
                self._close()
                continue
            break
        self._taken = (k, offset)
        return lines

    def _read(self, k: int, offset: int, size: int) -> bytes:
        if self._fd is None or self._fd[0] != k:
            self._close()
            for path in self._paths(k):
                try:
                    self._fd = (k, os.open(path, os.O_RDONLY))
                    break
                except FileNotFoundError:
                    continue
            else:  # not written yet
                return b""
        # A regular file: all there is up to size, in one read. Only what is there is asked for: a read of
        # ``size`` (256 kB) made Python map and unmap a buffer that large at each sample of an idle worker.
        there = os.fstat(self._fd[1]).st_size - offset
        return os.pread(self._fd[1], min(size, there), offset) if there > 0 else b""

    def sent(self, count: int | None = None) -> None:
        """The lines taken so far are in the sink (only the first ``count`` of the last take: the rest is taken
        again next time): note it (a new agent resumes there), drop whole segments."""
        if count is not None and count < sum(len(chunk) for _, _, chunk in self._parts):
            self._taken = self._position(count)
            self.behind = True
        self._parts = []
        if self._taken == (self._k, self._offset):
            return
        try:
            fd = os.open(self._marker, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, _SENT.pack(*self._taken), 0)
            finally:
                os.close(fd)
        except OSError as e:  # (a marker the worker did not make, on a full run folder) noted next time
            if not self._failed:
                self._failed = True
                logger.warning("cannot note what was sent of outbox %s (%s); noted when it can be", self._id, e)
            return
        for old in range(self._k, self._taken[0]):
            for path in self._paths(old):
                _unlink(path)
        self._k, self._offset = self._taken

    @property
    def unchanged(self) -> bool:
        """Whether the last take gave no line and moved nowhere: :meth:`sent` would have nothing to note."""
        return not self._parts and self._taken == (self._k, self._offset)

    def _position(self, count: int) -> tuple[int, int]:
        """Where the first ``count`` lines of the last take end (``count`` is fewer than it took)."""
        for k, offset, chunk in self._parts:
            if count < len(chunk):
                return k, offset + sum(len(line) + 1 for line in chunk[:count])
            count -= len(chunk)
        raise ValueError("count is more than the last take")

    def remove(self) -> None:
        """Every file of this outbox (the worker is gone and what it wrote was sent)."""
        self._close()
        if self._writes is not None:
            self._writes.close()
        k = self._k
        while self._exists(k):
            for path in self._paths(k):
                _unlink(path)
            k += 1
        _unlink(self._marker)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd[1])
            self._fd = None


def ids(folder: str) -> set[str]:
    """The ids of the outboxes in ``folder`` (a segment's or a marker's name names one).

    >>> import shutil, tempfile; d = tempfile.mkdtemp(); Outbox(d, "7.1").close(); Outbox(d, "8").close()
    >>> sorted(ids(d))
    ['7.1', '8']
    >>> shutil.rmtree(d)
    """
    return ids_of(os.listdir(folder))


def ids_of(names) -> set[str]:
    """The ids of the outboxes whose files are named in ``names`` (one listing of a folder)."""
    found = set()
    for name in names:
        wid, sep, _ = name.rpartition(".out-")
        if sep:
            found.add(wid)
        elif name.endswith(".sent"):
            found.add(name[: -len(".sent")])
    return found


def move(folder: str, worker_id: str, into: str, new_id: str) -> None:
    """Move outbox ``worker_id`` of ``folder`` (its segments and marker) into ``into`` as ``new_id``: what it
    did not send yet outlives the folder (renames: ``into`` is on the same file system)."""
    for name in os.listdir(folder):
        if name == f"{worker_id}.sent" or name.startswith(f"{worker_id}.out-"):
            os.rename(os.path.join(folder, name), os.path.join(into, new_id + name[len(worker_id) :]))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
