"""A worker's outbox: the points only it can make, handed to its host's agent, the host's one sender.

Custom metrics, the task stream and the fine performance metrics need the
worker object, so the worker makes those points; it does not send them. As in
prometheus_client's ``multiprocess`` mode (one file per process, one reader that
merges), each worker appends their line protocol to files of its own in the
session's run folder (:mod:`.runfolder`), ``workers/<id>.out-<k>``, segments of
about :data:`SEGMENT_BYTES`; the agent reads what is new at each sample, sends it
with its own points through its one sink, and then records how far it got in
``workers/<id>.sent``. A segment the agent has sent whole, once the next one
exists, is removed.

Nothing is lost: the files outlive a worker killed between its write and the
agent's send (the agent drains them before it forgets the worker), and a new
agent resumes from ``.sent`` where a replaced one stopped. A point is sent twice
only if an agent dies between its send and its note of it (InfluxDB keeps one
point per series and time: the same point twice is one).

Example
-------
>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> out = Outbox(folder, "w1", segment_bytes=16)
>>> out.send([b"m v=1i 1", b"m v=2i 2"]); out.send([b"m v=3i 3"])
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

import os
import struct

SEGMENT_BYTES = 1 << 20
TAKE_BYTES = 256 << 10  # what one take hands out at most: a backlog goes out over several samples, not in one burst
_LF = b"\x0c"  # a raw newline inside a string field, in the files: the encoder never writes a form feed
STALE = "stale-"  # the prefix of an outbox moved here from a session whose processes are all gone
_SENT = struct.Struct("<QQ")  # segment, offset


def _segment(folder: str, worker_id: str, k: int) -> str:
    return os.path.join(folder, f"{worker_id}.out-{k}")


class Outbox:
    """The worker's side: a sink (:class:`~.sinks.base.Sink`) whose ``send(lines)`` appends them to its
    current segment (one writer)."""

    def __init__(self, folder: str, worker_id: str, segment_bytes: int = SEGMENT_BYTES):
        self._folder, self._id, self._limit = folder, worker_id, segment_bytes
        self._k, self._fd, self._size = -1, None, 0
        self.points_written = 0
        self._next()

    def _next(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._k += 1
        self._fd = os.open(_segment(self._folder, self._id, self._k), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = 0

    def send(self, lines: list[bytes]) -> None:
        if not lines:
            return
        payload = b"\n".join(lines) + b"\n"
        if payload.count(b"\n") != len(lines):  # a string field holds a newline: one line, one newline in the file
            payload = b"\n".join(line.replace(b"\n", _LF) for line in lines) + b"\n"
        data = memoryview(payload)
        while data:  # the agent reads whole lines only: a partial write is completed before anything else
            data = data[os.write(self._fd, data) :]
        self.points_written += len(lines)
        self._size += len(payload)
        if self._size >= self._limit:
            self._next()

    def flush(self, drain: float = 0.0) -> None:
        """Nothing to do: each send is written through to the segment the agent reads."""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def counters(self) -> list[dict]:
        return [{"kind": "outbox", "points_written": self.points_written}]

    def delivery(self) -> list[dict]:
        return []  # the host's agent sends these lines, counted in its own sink's delivery points


class OutboxReader:
    """The agent's side for one worker: :meth:`take` what is new, :meth:`sent` once the sink has it."""

    def __init__(self, folder: str, worker_id: str):
        self._folder, self._id = folder, worker_id
        self._marker = os.path.join(folder, f"{worker_id}.sent")
        try:
            with open(self._marker, "rb") as f:
                self._k, self._offset = _SENT.unpack(f.read(_SENT.size))
        except (OSError, struct.error):  # nothing sent yet
            self._k, self._offset = 0, 0
        self._taken = (self._k, self._offset)  # where the lines handed out end
        self.behind = False  # the last take left lines for the next
        self._fd = None

    def take(self, limit: int = TAKE_BYTES) -> list[bytes]:
        """The whole lines written since the last :meth:`take` (this segment, then the next ones), about
        ``limit`` bytes at most (at least one line): a backlog (a replaced agent's, a dead session's) goes out
        over the next samples instead of in one burst that a Telegraf's socket would drop in part."""
        k, offset = self._taken
        lines: list[bytes] = []
        self.behind = False
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
            if end:
                chunk = data[: end - 1].split(b"\n")
                lines += [line.replace(_LF, b"\n") for line in chunk] if _LF in data else chunk
                offset += end
                limit -= end
            if len(data) == want:  # there is more than this take hands out
                self.behind = True
            elif end == len(data) and os.path.exists(_segment(self._folder, self._id, k + 1)):
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
            try:
                self._fd = (k, os.open(_segment(self._folder, self._id, k), os.O_RDONLY))
            except FileNotFoundError:  # not written yet
                return b""
        return os.pread(self._fd[1], size, offset)  # a regular file: all there is up to size, in one read

    def sent(self) -> None:
        """The lines taken so far are in the sink: note it (a new agent resumes there), drop whole segments."""
        if self._taken == (self._k, self._offset):
            return
        fd = os.open(self._marker, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, _SENT.pack(*self._taken), 0)
        finally:
            os.close(fd)
        for old in range(self._k, self._taken[0]):
            _unlink(_segment(self._folder, self._id, old))
        self._k, self._offset = self._taken

    def remove(self) -> None:
        """Every file of this outbox (the worker is gone and what it wrote was sent)."""
        self._close()
        k = self._k
        while os.path.exists(_segment(self._folder, self._id, k)):
            _unlink(_segment(self._folder, self._id, k))
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
    found = set()
    for name in os.listdir(folder):
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
