"""What a worker and its host's sampling agent share: the task snapshot one way, the agent's beat the other.

Both are :class:`~.seqlock.SnapshotBuffer` s over files in the session's host run folder (:mod:`.runfolder`):
one writer, any readers, under a seqlock.

**The snapshot** (worker -> agent, ``workers/<id>.snap``, :data:`BUFFER_BYTES`), written by
:class:`Publisher` on the worker's event loop just before the agent's next sample when tasks started or
ended (``transition``), and when bytes held or the clock offset changed (once a second): compact JSON with
the change counter ``seq``, the busy-time counter (:attr:`Snapshot.busy`: a simulated GPU averages it
between reads), the executing tasks and the *recent* ones, tasks that ended before the agent may have
sampled them. Each entry is ``[key, job, dag, start]`` (``start``: the ``seq`` of its start), a recent one
encoded once. A sample counts a recent task as executing when it started after the snapshot of the
previous sample (``start > acked``): a task that started and ended between two samples leaves a trace.
Those the agent has acknowledged are pruned (looked at every :data:`ASK_EVERY` carried tasks: one carried
longer is not counted twice, its start is not after ``acked``); beyond :data:`RECENT`, the older half is
folded into one keyless entry per job and DAG (tags stay exact), so a publish stays a few µs. A snapshot
too big for the buffer drops keys (``null``), then the oldest recent tasks; counts and tags stay exact
while entries remain.

**The beat** (agent -> workers, ``agent.beat``, :data:`BEAT_BYTES`), written by the agent before each
sample: its ``pid``, ``samples``, ``extra`` (on a wake) and ``time`` (``time.monotonic()``, one clock for
all processes on Linux) packed, then JSON that changes less often: ``acked`` (worker id -> the ``seq`` of
the snapshot that sample used), ``idle`` (the workers that sample saw idle), ``ticks`` (its schedule:
``[origin, interval]``, samples at ``origin + k * interval``), what it ``found`` of each worker's GPUs,
its sink's delivery ``counters`` (once a second) and its latest ``reports``.

Example
-------
>>> buf, beat = SnapshotBuffer.create(4096), SnapshotBuffer.create(BEAT_BYTES)
>>> pub = Publisher(buf, BeatReader(beat, "w1").acked, nthreads=2)
>>> pub.started(("x", 0), job=1, dag=3)
>>> pub.started("short", job=1, dag=4); pub.ended("short")  # its job and DAG
(1, 4)
>>> reader = SnapshotReader(buf); reader.refresh()
>>> snap = reader()
>>> [k for k, _, _ in snap.running], snap.job_tag, snap.dag_tag
([('x', 0), 'short'], '1', '3,4')
>>> write_beat(beat, 1234, 1, 0, json.dumps({"acked": {"w1": reader.acked}}).encode()); pub.acked()
3
>>> reader.refresh(); reader().dag_tag  # the brief task was sampled once
'3'
>>> buf.close(); beat.close()
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
import time
from typing import Callable, NamedTuple

from .. import jobtags
from .seqlock import HEADER, SnapshotBuffer

logger = logging.getLogger(__name__)

BUFFER_BYTES = 128 << 10  # reserved whole (:mod:`.seqlock`); beyond, keys go first
BEAT_BYTES = 1 << 16
RECENT = 64  # ended tasks carried with their keys until the agent has sampled them (then folded)
ASK_EVERY = 16  # carried tasks between two looks at what the agent acknowledged (pruning those it sampled)


class Snapshot(NamedTuple):
    """What one worker is doing at one instant."""

    running: tuple  # ((key, job, dag), ...) in start order
    nthreads: int
    managed_bytes: int
    last_job: int
    scheduler_delay: float = 0.0  # the worker's raw clock-offset estimate (Dask's scheduler_delay)
    busy: float | None = None  # busy-time counter: task ends - task starts (time.monotonic() s); None: not kept
    busy_n: int = 0  # tasks executing (not the brief ones): busy thread-seconds up to t = busy + busy_n * t

    @property
    def executing(self) -> int:
        return len(self.running)

    @property
    def job_tag(self) -> str:
        """Jobs of executing tasks ('1,2'), else the last job run here.

        Tasks submitted while no session ran carry job 0 and are left out."""
        return jobtags.format((job for _, job, _ in self.running), idle=self.last_job)

    @property
    def dag_tag(self) -> str:
        """DAGs of executing tasks ('3,5'); '0' when idle."""
        return jobtags.format(dag for _, _, dag in self.running)


def plain_key(k):
    """A task key as JSON-ready data: tuples become lists, numbers stay, anything else is ``str``.

    >>> plain_key(("x", 1, b"y"))
    ['x', 1, "b'y'"]
    """
    return [plain_key(p) for p in k] if isinstance(k, tuple) else (k if isinstance(k, (int, float)) else str(k))


def entry(key, job: int, dag: int, start: int) -> bytes:
    """One task of a snapshot, as JSON bytes: ``[key, job, dag, start]`` (the key as :func:`plain_key`).

    >>> entry(("x", 1, b"y"), 2, 3, 4) == json.dumps([plain_key(("x", 1, b"y")), 2, 3, 4]).replace(" ", "").encode()
    True
    """
    return b"[%s,%d,%d,%d]" % (_key_json(key).encode(), job, dag, start)


# json's C encoder writes what plain_key makes of Dask's keys (str, bytes, int, float, tuples of them) from the
# keys themselves: tuples as lists, anything else through ``default=str``
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str, check_circular=False)


def _entries(tasks) -> bytes:
    """:func:`entry` of each ``(start, key, job, dag)``, joined by commas, in one call of json's C encoder (a
    deferred write carries the tasks of a whole interval).

    >>> _entries([(4, ("x", 1, b"y"), 2, 3), (5, "z", 2, 3)]) == entry(("x", 1, b"y"), 2, 3, 4) + b"," + entry("z", 2, 3, 5)
    True
    """
    return _ENCODER.encode([[key, job, dag, start] for start, key, job, dag in tasks])[1:-1].encode()


def _key_json(k) -> str:
    """``json.dumps(plain_key(k), ensure_ascii=False)``, faster for the usual str, int and tuple keys."""
    kind = type(k)
    if kind is str:
        return _string(k)
    if kind is int:
        return str(k)
    if kind is tuple:
        return "[" + ",".join([_key_json(p) for p in k]) + "]"
    if k is None:  # no key: a folded entry
        return "null"
    return json.dumps(plain_key(k), ensure_ascii=False)


_string = json.encoder.encode_basestring  # a JSON string, non-ASCII kept (C)


_SNAPSHOT = b'{"seq":%d,"threads":%d,"bytes":%d,"last":%d,"delay":%s,"busy":%r,"running":[%s],"recent":[%s]}'


def _delay(delay: float) -> bytes:
    return repr(float(delay) if math.isfinite(delay) else 0.0).encode()


def encode_snapshot(
    seq: int,
    nthreads: int,
    managed_bytes: int,
    last_job: int,
    delay: float,
    running: list[bytes],
    recent: list[bytes],
    limit: int = BUFFER_BYTES,
    busy: float = 0.0,
) -> bytes:
    """The snapshot as compact JSON of at most ``limit`` bytes (entries from :func:`entry`)."""
    state = (seq, nthreads, managed_bytes, last_job, _delay(delay), busy)
    data = _SNAPSHOT % (*state, b",".join(running), b",".join(recent))
    if len(data) <= limit:
        return data
    head = data[: data.index(b'"running"')]
    keyless = [json.dumps([None, *json.loads(e)[1:]]).encode() for e in (*running, *recent)]
    running, recent = keyless[: len(running)], keyless[len(running) :]
    while True:  # keys dropped; then the oldest recent tasks
        data = head + b'"running":[' + b",".join(running) + b'],"recent":[' + b",".join(recent) + b"]}"
        if len(data) <= limit:
            return data
        if not recent:
            raise ValueError(f"task snapshot needs {len(data)} bytes without keys; buffer holds {limit}")
        recent = recent[len(recent) // 2 + 1 :]


class Published(NamedTuple):
    """A worker's snapshot buffer, decoded."""

    seq: int
    snapshot: Snapshot  # the executing tasks only
    recent: tuple  # ((key, job, dag, start), ...) of tasks that ended


def _tuples(k):
    """Inverse of :func:`plain_key` for what JSON returns: lists become tuples again."""
    return tuple(_tuples(p) for p in k) if isinstance(k, list) else k


def decode_snapshot(data: bytes) -> Published:
    d = json.loads(data)
    running = tuple((_tuples(k), j, g) for k, j, g, _ in d["running"])
    return Published(
        d["seq"],
        Snapshot(running, d["threads"], d["bytes"], d["last"], d["delay"], d.get("busy"), len(running)),
        tuple((_tuples(k), j, g, s) for k, j, g, s in d["recent"]),
    )


_BEAT = struct.Struct("<qQQd")  # pid, samples, extra samples, time.monotonic(); then the rest as JSON


def write_beat(buffer: SnapshotBuffer, pid: int, samples: int, extra: int, doc: bytes) -> None:
    """The agent's beat: its liveness (packed, cheap to write every sample) and ``doc``, the JSON of the rest
    (``acked``, ``counters``, ``reports``, ...): one line, or two (what changes every sample, then what
    changes less often: workers decode that only when it changed)."""
    if len(doc) > buffer.capacity - _BEAT.size:  # reports and counters are what grows: drop them
        doc = b"\n".join(
            json.dumps({**json.loads(part), "reports": [], "counters": []}, separators=(",", ":")).encode()
            for part in doc.split(b"\n")
        )
    buffer.write(_BEAT.pack(pid, samples, extra, time.monotonic()) + doc)


def write_delay(now: float, ticks, lag: float) -> float:
    """Seconds from ``now`` to ``lag`` before the agent's first sample at least ``lag`` away: a worker's
    changes are written then. ``ticks``: the agent's schedule ``[origin, interval]`` (samples at
    ``origin + k * interval``, monotonic clock); None (not known yet): ``lag``.

    >>> round(write_delay(10.012, [10.0, 0.05], 0.005), 3)  # for the sample at 10.05
    0.033
    >>> round(write_delay(10.047, [10.0, 0.05], 0.005), 3)  # 10.05 is too close: the one at 10.1
    0.048
    """
    if not ticks:
        return lag
    origin, interval = ticks
    return origin + math.ceil((now + lag - origin) / interval) * interval - lag - now


class BeatReader:
    """A worker's view of the agent's beat (a dict: ``pid``, ``samples``, ``extra``, ``time`` and the
    JSON part's keys), read again only when it was rewritten and its JSON decoded only when it changed."""

    def __init__(self, buffer: SnapshotBuffer, worker_id: str):
        self.buffer, self.worker_id = buffer, worker_id
        self._seq, self._last = -1, None
        self._decoded = (None, {})  # the JSON part as read, and decoded (one attribute: threads share a reader)

    @classmethod
    def open(cls, path: str, worker_id: str) -> BeatReader | None:
        """A reader of the beat file at ``path``; None while there is none (or it is not whole yet)."""
        try:
            return cls(SnapshotBuffer.open(path, BEAT_BYTES), worker_id)
        except (OSError, ValueError):
            return None

    def inode(self) -> int:
        """The file's inode: a new agent writes a new file (its readers then follow it)."""
        return os.fstat(self.buffer.fd).st_ino

    def __call__(self) -> dict | None:
        seq = self.buffer.version()
        if seq != self._seq or seq % 2:
            data, last = self.buffer.read(), None
            if data and len(data) >= _BEAT.size:
                head, _, tail = data[_BEAT.size :].partition(b"\n")
                try:
                    if tail != self._decoded[0]:  # what changes less often: decoded when it changed
                        self._decoded = (tail, json.loads(tail) if tail else {})
                    fast = json.loads(head)
                except ValueError:
                    self._decoded, fast = (None, {}), {}
                pid, samples, extra, when = _BEAT.unpack_from(data)
                last = {**self._decoded[1], **fast, "pid": pid, "samples": samples, "extra": extra, "time": when}
            # cached under the version seen before the read; a failed read is read again next time
            self._last, self._seq = last, seq if last is not None or not seq else -1
        return self._last

    def when(self) -> float:
        """The ``time`` of the latest beat at a glance (no seqlock: a torn read is possible, so only a
        hint; :meth:`__call__` for a value to act on)."""
        return _BEAT.unpack_from(self.buffer.raw(), HEADER)[3]

    def acked(self) -> int:
        """The ``seq`` of this worker's snapshot that the agent's latest sample used (0: none yet)."""
        beat = self()
        return int(beat.get("acked", {}).get(self.worker_id, 0)) if beat else 0

    def saw_idle(self) -> bool:
        """Whether the agent's latest sample saw this worker idle (or there was none yet): only then is a
        task starting here worth a wake; otherwise its next tick shows the task anyway."""
        beat = self()
        return not beat or self.worker_id in beat.get("idle", (self.worker_id,))


class Publisher:
    """The worker's side: its executing and recent tasks; writes the snapshot on each change. Called on the
    event loop only; never raises (an error is logged once). ``acked()``: the ``seq`` the agent's latest
    sample used (:meth:`BeatReader.acked`).

    With :attr:`defer` set (beside the agent, :meth:`..worker.agentlink.AgentLink.publish_from`), a change is
    written later with those that follow it (just before the agent's next sample): short tasks cost a write
    per interval, not one or two each; entries are encoded at the write, each recent one once. :meth:`flush`
    writes a pending change now (before a wake)."""

    def __init__(
        self,
        buffer: SnapshotBuffer,
        acked: Callable[[], int],
        nthreads: int,
        running=(),
        last_job: int = 0,
        keep: int = RECENT,
    ):
        self._buffer, self._agent_acked, self._keep = buffer, acked, keep
        self.seq, self.nthreads, self.last_job = 0, nthreads, last_job
        self.managed_bytes, self.delay, self._delay_json = 0, 0.0, b"0.0"
        self._running: dict = {}  # key -> (start seq, job, dag)
        self.busy = 0.0  # the busy-time counter (Snapshot.busy): minus each start's time, plus each end's
        self._recent: list = []  # (start seq, key, job, dag) of ended tasks
        self._recent_json, self._encoded = b"", 0  # the first ``_encoded`` recent entries, joined
        self._acked = 0
        self._ask_at = ASK_EVERY  # carried tasks at which to ask what the agent acknowledged
        self._failed = False
        self.defer: Callable[[Callable], object] | None = None
        self._pending = False
        self.sync(running)
        self.publish()

    def started(self, key, job: int, dag: int) -> None:
        self.seq += 1
        if job:
            self.last_job = job
        self.busy -= 0.0 if key in self._running else time.monotonic()
        self._running[key] = (self.seq, job, dag)
        if not self._pending:  # (a change pending is written with this one)
            self._changed()

    def ended(self, key) -> tuple[int, int] | None:
        """The task's ``(job, dag)``; None if it was not executing."""
        task = self._running.pop(key, None)
        if task is None:
            return None
        self.seq += 1
        self.busy += time.monotonic()
        start, job, dag = task
        if start > self._acked:  # no sample had seen it when last asked: carried until one has
            self._recent.append((start, key, job, dag))
            if (n := len(self._recent)) >= self._ask_at or n > self._keep:  # asked every ASK_EVERY, not per task
                self.acked()
                if len(self._recent) > self._keep:
                    self._fold()
                self._ask_at = len(self._recent) + ASK_EVERY
        if not self._pending:
            self._changed()
        return job, dag

    def idle(self) -> bool:
        return not self._running  # no task executing

    def sync(self, running) -> None:
        """Executing tasks as ``running`` (``((key, job, dag), ...)``) lists them: catch up with changes since
        this publisher was created."""
        now = {key for key, _, _ in running}
        for key in [k for k in self._running if k not in now]:
            self.ended(key)
        for key, job, dag in running:
            if key not in self._running:
                self.started(key, job, dag)

    def _changed(self) -> None:
        if self.defer is None:
            self.publish()
        elif not self._pending:
            self._pending = True
            self.defer(self.flush)

    def flush(self) -> None:
        """Write a change :attr:`defer` holds back, now."""
        if self._pending:
            self.publish()

    def _fold(self) -> None:
        """Too many ended tasks unsampled: the older half becomes one keyless entry per (job, dag),
        started when the latest of them did (tags stay exact; a fold may show a DAG one sample more)."""
        half = len(self._recent) // 2
        latest: dict = {}
        for start, _, job, dag in self._recent[:half]:
            latest[job, dag] = max(start, latest.get((job, dag), 0))
        self._recent = [(start, None, job, dag) for (job, dag), start in latest.items()] + self._recent[half:]
        self._recent_json, self._encoded = b"", 0

    def update(self, managed_bytes: int, delay: float) -> None:
        """Bytes held and the clock offset (once a second); published if they changed."""
        if (managed_bytes, delay) != (self.managed_bytes, self.delay):
            self.managed_bytes, self.delay, self._delay_json = managed_bytes, delay, _delay(delay)
            self.acked()
            self.publish()

    def acked(self) -> int:
        """The ``seq`` of the snapshot the agent's latest sample used; prunes what it has seen."""
        acked = self._agent_acked()
        if acked > self._acked:
            self._acked = acked
            if self._recent:
                self._recent = [t for t in self._recent if t[0] > acked]
                self._recent_json, self._encoded = b"", 0
        return self._acked

    def unsampled(self) -> bool:
        """Whether tasks that no sample has seen are carried (then a last sample is due at leave)."""
        return any(t[0] > self.acked() for t in self._recent)

    def publish(self) -> None:
        self._pending = False
        try:
            if self._encoded < len(self._recent):  # the entries of tasks that ended since the last write
                new = _entries(self._recent[self._encoded :])
                self._recent_json = self._recent_json + b"," + new if self._recent_json else new
                self._encoded = len(self._recent)
            running = _entries([(start, key, job, dag) for key, (start, job, dag) in self._running.items()])
            head = (self.seq, self.nthreads, self.managed_bytes, self.last_job, self._delay_json, self.busy)
            data = _SNAPSHOT % (*head, running, self._recent_json)
            if len(data) > self._buffer.capacity:  # rare: without keys, then fewer recent tasks
                running = [entry(key, job, dag, start) for key, (start, job, dag) in self._running.items()]
                recent = [entry(key, job, dag, start) for start, key, job, dag in self._recent]
                state = (self.seq, self.nthreads, self.managed_bytes, self.last_job, self.delay)
                data = encode_snapshot(*state, running, recent, self._buffer.capacity, self.busy)
            self._buffer.write(data)
        except Exception as e:
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        if not self._failed:
            self._failed = True
            logger.warning("influx-metrics: cannot publish the task snapshot: %r (reported once)", e)


IDLE = Snapshot((), 0, 0, 0)


class SnapshotReader:
    """The agent's side for one worker: ``refresh()`` once per sample (the running tasks plus the recent ones
    no sample has seen; a failed read keeps the previous snapshot, without the recent ones), then
    ``reader()`` is that snapshot and :attr:`acked` the ``seq`` it used."""

    def __init__(self, buffer: SnapshotBuffer):
        self._buffer = buffer
        self._snap = self._base = IDLE  # the latest snapshot, and it without the recent tasks
        self.acked = 0
        self._version = None

    def refresh(self) -> None:
        version = self._buffer.version()
        if version == self._version:  # unchanged since the last sample (an idle worker): its brief tasks counted
            self._snap = self._base
            return
        self._version = version if version % 2 == 0 else None
        data = self._buffer.read()
        if data is not None:
            seq, self._base, recent = decode_snapshot(data)
            brief = tuple((k, j, d) for k, j, d, start in recent if start > self.acked)
            self._snap = self._base._replace(running=self._base.running + brief) if brief else self._base
            self.acked = seq
        else:  # no stable copy: the previous one, its brief tasks already counted; read again next time
            self._snap, self._version = self._base, None

    def __call__(self) -> Snapshot:
        return self._snap

    def close(self) -> None:
        self._buffer.close()
