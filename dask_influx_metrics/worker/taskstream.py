"""The task stream: one ``task`` point per finished task execution (tracking name ``task-stream``).

On the event loop the worker plugin only appends one small record per finished
execution to :attr:`TaskStream.ended` (see ``MetricsWorkerPlugin.transition``):
``(key, job, dag, end, ended_at)``, where ``end`` is ``(state, prefix,
startstops, nbytes)`` as the worker's state machine left them (None when the
task was already forgotten) and ``ended_at`` the worker's ``time.time()``. Once
per tick the link's thread (beside the agent) calls :meth:`TaskStream.lines`, an
in-process sampler (``sampler.mode: thread``) :meth:`TaskStream.points`: either
drains the records, makes their task points or lines and hands the records to
the fine performance metrics (:mod:`.finemetrics`) as weights. :meth:`~TaskStream.lines`
writes the encoder's bytes without building points or calling the encoder
(the link's thread pays ~2 us a task, not ~4.5): each series' escaped prefix is
made by the encoder once and checked against it on one line of each shape, the
numbers of a tick are written by one ``orjson.dumps`` as the encoder writes
them, and a tick holding anything else (fields left out, a NaN, an int beyond
int64) is left to the encoder whole.

A point's time is the end of the task's execution (Dask's ``compute`` startstop,
which Dask already puts on the scheduler's clock); two tasks ending on the same
nanosecond in one series are moved apart by 1 ns, so neither overwrites the
other in InfluxDB.

Example
-------
>>> from dask_influx_metrics.schema import TRACKING
>>> stream = TaskStream(frozenset(TRACKING["task-stream"]), {"host": "h", "worker": "w"})
>>> stream.ended.append((("inc-1", 0), 2, 5, ("memory", "inc", ({"action": "compute", "start": 10.0,
...                      "stop": 10.5},), 28), 10.6))
>>> [p] = stream.points(now_ns=0)
>>> p.tags["job"], p.tags["dag"], p.tags["prefix"], p.tags["state"], p.fields["duration"], p.time_ns
('2', '5', 'inc', 'memory', 0.5, 10500000000)
>>> stream.ended.append(("inc-2", 2, 5, ("memory", "inc", ({"action": "compute", "start": 11.0,
...                      "stop": 11.25},), 28), 11.3))
>>> [line] = stream.lines(now_ns=0)
>>> line.split(b" ")  # doctest: +NORMALIZE_WHITESPACE
[b'task,dag=5,host=h,job=2,prefix=inc,state=memory,worker=w',
 b'key="inc-2",start=11.0,duration=0.25,compute=0.25,transfer=0.0,disk_read=0.0,disk_write=0.0,nbytes=28i',
 b'11250000000']
"""

from __future__ import annotations

import collections
import operator
from typing import Callable

import orjson
from dask.utils import key_split

from .. import lineprotocol
from ..schema import ACTIVITY, TASK, Point
from .finemetrics import FineMetrics

MAX_PENDING = 1_000_000  # records held between two ticks at most (the oldest go first)
MAX_SERIES = 4096  # series whose line texts are kept at most (cleared when full)
STATES = {"memory": "memory", "error": "error"}  # any other end: released while running
SPENT = {"transfer": 0, "disk-read": 1, "disk-write": 2}  # startstops action -> place in a record's spent
FIELDS = ("key", "start", "duration", "compute", "transfer", "disk_read", "disk_write", "nbytes")  # in a point's order
_FORGOTTEN = ("forgotten", None, (), None)
_BY_STOP = operator.itemgetter(0)
_NONE = -(1 << 63)  # before any time line protocol can write: no time written in a series yet
_INT64 = (-(1 << 63), (1 << 63) - 1)
_NO_SPENT = (0.0, 0.0, 0.0)
_ESCAPED = '"\\\r\f'  # what a string field's text escapes or replaces (lineprotocol.string)
_ZEROS = "transfer=0.0,disk_read=0.0,disk_write=0.0"  # no time spent otherwise, as the encoder writes it


def wanted(fields) -> bool:
    """Whether ``fields`` (settings.fields) ask for task or activity points."""
    return any(m in (TASK, ACTIVITY) for m, _ in fields)


class TaskStream:
    """Finished task executions -> ``task`` points and (with the ``activity`` fields) ``activity`` points, as
    :class:`~..schema.Point` (:meth:`points`) or line protocol (:meth:`lines`). ``field_tags``: the tags
    :meth:`lines` writes as fields (settings.field_tags; the sampler moves them in the points)."""

    def __init__(
        self,
        fields,
        base_tags: dict,
        clock_offset: Callable[[], float] = lambda: 0.0,
        field_tags: tuple = (),
    ):
        self.ended: collections.deque = collections.deque(maxlen=MAX_PENDING)
        self._want = frozenset(n for m, n in fields if m == TASK)
        self._every = self._want >= frozenset(FIELDS)  # every field a record has: no field left out
        self._tags, self._offset, self._moved = dict(base_tags), clock_offset, tuple(field_tags)
        # with Dask's execute digests fed to fine.added (the worker plugin taps them)
        self.fine = FineMetrics(fields, base_tags) if (ACTIVITY, "value") in fields else None
        self._before: dict = {}  # series -> the ns written in it the previous tick (a set)
        self._texts: dict = {}  # series -> (prefix, the tags written as fields): see _lines

    def pending(self) -> bool:
        """Whether records (or Dask's digests, for activity points) wait for the next collect."""
        return bool(self.ended) or (self.fine is not None and self.fine.pending())

    def points(self, now_ns: int) -> list[Point]:
        """Drain the finished executions: their task points, then the activity points of this tick."""
        drained = self._drain()
        if drained is None:
            return []
        taken, records = drained
        out = self._points(records, self._times(records)) if self._want else []
        return out + self._activity(taken, records, now_ns)

    def lines(self, now_ns: int) -> list[bytes]:
        """:meth:`points`, written: the bytes ``lineprotocol.encode_many`` writes for them with the
        ``field_tags`` moved (``lineprotocol.tags_as_fields``), task lines made without building points (the
        link's thread writes them into the outbox, ~1 us a task where points + encoder cost ~4)."""
        drained = self._drain()
        if drained is None:
            return []
        taken, records = drained
        out = self._lines(records, self._times(records)) if self._want else []
        return out + self._encode(self._activity(taken, records, now_ns))

    def _drain(self) -> tuple | None:
        """``(digests taken, records sorted by end)``; None when nothing ended and nothing was added (an idle
        worker costs one check)."""
        if not self.ended and (self.fine is None or not self.fine.pending()):
            return None
        # digests first: a task's digests are added after its record, so every digest taken here
        # has its record drained below (a record whose digests come later waits for them)
        taken = self.fine.take() if self.fine else None
        pop, record = self.ended.popleft, self._record
        records = [record(pop()) for _ in range(len(self.ended))]  # those appended meanwhile: next tick
        records.sort(key=_BY_STOP)  # by end time: bumped timestamps keep their order
        return taken, records

    def _activity(self, taken, records: list, now_ns: int) -> list[Point]:
        if self.fine is None:
            return []
        return self.fine.points(taken, [(r[1][2], r[1][0], r[2]) for r in records], now_ns)

    def _encode(self, points: list[Point]) -> list[bytes]:
        if not points:
            return []
        if self._moved:
            points = [lineprotocol.tags_as_fields(p, self._moved) for p in points]
        return lineprotocol.encode_many(points)

    def _record(self, raw) -> tuple:
        """``(stop, (job, dag, prefix, state), duration, start, key, spent, nbytes)``; stop and start on the
        scheduler's clock, ``spent``: seconds ``(transfer, disk_read, disk_write)`` or None (all 0)."""
        key, job, dag, end, ended_at = raw
        state, prefix, startstops, nbytes = end or _FORGOTTEN
        compute = spent = None
        for s in startstops:  # one pass: the last compute interval, the time spent otherwise
            action = s["action"]
            if action == "compute":
                compute = s
            elif action in SPENT:
                if spent is None:
                    spent = [0.0, 0.0, 0.0]
                spent[SPENT[action]] += float(s["stop"] - s["start"])
        if compute is not None:  # Dask's own interval, already on the scheduler's clock
            start, stop = compute["start"], compute["stop"]
        else:  # it never ran its function (failed before, rescheduled)
            start = stop = ended_at + self._offset()
        series = (job, dag, prefix or key_split(key), STATES.get(state, "cancelled"))
        return stop, series, float(stop - start), float(start), str(key), spent, None if nbytes is None else int(nbytes)

    def _times(self, records: list) -> list[int]:
        """One time per record (sorted by end), one per series: a time taken in its series this tick or the
        previous one moves on by 1 ns."""
        times, ticks, before, last, tick = [], {}, self._before, None, None
        for r in records:
            if r[1] != last:  # (short tasks of one series end one after another)
                last = r[1]
                tick = ticks.get(last)
                if tick is None:  # [last ns, ns written, the previous tick's]
                    tick = ticks[last] = [_NONE, set(), before.get(last)]
            t = round(r[0] * 1e9)
            if t <= tick[0]:  # sorted by end: only an equal time (or one moved on) gets here
                t = tick[0] + 1
            if tick[2]:
                while t in tick[2]:
                    t += 1
            tick[0] = t
            tick[1].add(t)
            times.append(t)
        self._before = {series: tick[1] for series, tick in ticks.items()}
        return times

    def _series_tags(self, series: tuple) -> dict:
        job, dag, prefix, state = series
        return {**self._tags, "job": str(job), "dag": str(dag), "prefix": prefix, "state": state}

    def _points(self, records: list, times: list) -> list[Point]:
        """The task points of ``records`` at ``times``: one tags dict per series and tick."""
        out, tags_of, every, want = [], {}, self._every, self._want
        for (_, series, duration, start, key, spent, nbytes), t in zip(records, times):
            tags = tags_of.get(series)
            if tags is None:
                tags = tags_of[series] = self._series_tags(series)
            transfer, disk_read, disk_write = spent or _NO_SPENT
            fields = {
                "key": key,
                "start": start,
                "duration": duration,
                "compute": duration,
                "transfer": transfer,
                "disk_read": disk_read,
                "disk_write": disk_write,
            }
            if nbytes is not None:
                fields["nbytes"] = nbytes
            if not every:
                fields = {k: v for k, v in fields.items() if k in want}
            out.append(Point(TASK, tags, fields, t))
        return out

    def _lines(self, records: list, times: list) -> list[bytes]:
        """The task lines of ``records`` at ``times``, written as the encoder writes their points: each series'
        prefix and moved tags made once (:meth:`_series_text`), the numbers of the whole tick written by one
        ``orjson.dumps`` (the encoder's float text), one f-string a line. What this cannot write exactly
        (fields left out, a NaN, an int beyond int64, a series the encoder writes otherwise) is left to the
        encoder: it writes the tick's points."""
        if not self._every:
            return self._encode(self._points(records, times))
        numbers = []
        for r, t in zip(records, times):
            numbers += (r[3], r[2], t, r[6] or 0)  # start, duration, time, nbytes
        try:
            text = orjson.dumps(numbers).decode()
        except TypeError:  # an int beyond 64 bits, which the encoder leaves out
            return self._encode(self._points(records, times))
        if "n" in text:  # null: NaN or inf, which the encoder leaves out
            return self._encode(self._points(records, times))
        number = iter(text[1:-1].split(",")).__next__
        keys = [r[4] for r in records]
        joined = "".join(keys)
        plain = not any(c in joined for c in _ESCAPED)  # (no key needs escaping: the usual)
        out, texts, high = [], self._texts, _INT64[1]
        last = head = tail = None
        for (_, series, _, _, _, spent, nbytes), key in zip(records, keys):
            start, duration, t, size = number(), number(), number(), number()
            if series != last:
                last = series
                head, tail = texts.get(series) or self._series_text(series)
                if head is None:
                    return self._encode(self._points(records, times))
            if not plain:
                key = lineprotocol.string(key)
            if spent is None:
                spent = _ZEROS
            else:
                spent = orjson.dumps(spent).decode()
                if "n" in spent:
                    return self._encode(self._points(records, times))
                spent = "transfer={},disk_read={},disk_write={}".format(*spent[1:-1].split(","))
            if nbytes is None:
                out.append(f'{head}key="{key}",start={start},duration={duration},compute={duration},{spent}{tail} {t}')
            elif nbytes <= high:
                out.append(
                    f'{head}key="{key}",start={start},duration={duration},compute={duration},{spent},'
                    f"nbytes={size}i{tail} {t}"
                )
            else:  # the encoder leaves it out (and counts it)
                return self._encode(self._points(records, times))
        return [line.encode("utf-8", "replace") for line in out]  # (lone surrogates: "?", as the encoder's)

    def _series_text(self, series: tuple) -> tuple:
        """``(prefix, the tags written as fields)`` of ``series``' lines, kept; ``(None, None)`` when the
        encoder would write its lines otherwise (checked on one line of each shape)."""
        if len(self._texts) >= MAX_SERIES:
            self._texts.clear()
        tags = self._series_tags(series)
        moved = {n: tags.pop(n) for n in self._moved if n in tags}
        head = lineprotocol.prefix(TASK, tags)
        tail = "".join(f',{k}="{lineprotocol.string(v)}"' for k, v in moved.items() if type(v) is str)
        entry = head, tail
        values = {"key": 'a"\\', "start": 1.5, "duration": 1e-7, "compute": 1e-7}
        for spent, nbytes in ((None, None), ([0.5, 0.0, 2e-5], 8)):
            record = (0.0, series, 1e-7, 1.5, values["key"], spent, nbytes)
            fields = {**values, **dict(zip(FIELDS[4:7], spent or _NO_SPENT))}
            if nbytes is not None:
                fields["nbytes"] = nbytes
            point = lineprotocol.tags_as_fields(Point(TASK, self._series_tags(series), fields, 5), self._moved)
            self._texts[series] = entry
            if head is None or self._lines([record], [5]) != lineprotocol.encode_many([point]):
                entry = None, None
        self._texts[series] = entry
        return entry
