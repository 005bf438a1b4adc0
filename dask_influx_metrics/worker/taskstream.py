"""The task stream: one ``task`` point per finished task execution (tracking name ``task-stream``).

On the event loop the worker plugin only appends one small record per finished
execution to :attr:`TaskStream.ended` (see ``MetricsWorkerPlugin.transition``):
``(key, job, dag, end, ended_at)``, where ``end`` is ``(state, prefix,
startstops, nbytes)`` as the worker's state machine left them (None when the
task was already forgotten) and ``ended_at`` the worker's ``time.time()``. The
sampler thread calls :meth:`TaskStream.points` once per tick: it drains the
records, builds the points (sent in the same batch as the sample) and hands
them to the fine performance metrics (:mod:`.finemetrics`) as weights.

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
"""

from __future__ import annotations

import collections
import operator
from typing import Callable

from dask.utils import key_split

from ..schema import ACTIVITY, TASK, Point
from .finemetrics import FineMetrics

MAX_PENDING = 1_000_000  # records held between two ticks at most (the oldest go first)
STATES = {"memory": "memory", "error": "error"}  # any other end: released while running
SPENT = {"transfer": "transfer", "disk-read": "disk_read", "disk-write": "disk_write"}
FIELDS = frozenset({"key", "start", "duration", "compute", "transfer", "disk_read", "disk_write", "nbytes"})
_FORGOTTEN = ("forgotten", None, (), None)
_BY_STOP = operator.itemgetter(0)
_NONE = -(1 << 63)  # before any time line protocol can write: no time written in a series yet


def wanted(fields) -> bool:
    """Whether ``fields`` (settings.fields) ask for task or activity points."""
    return any(m in (TASK, ACTIVITY) for m, _ in fields)


class TaskStream:
    """Finished task executions -> ``task`` points and (with the ``activity`` fields) ``activity`` points."""

    def __init__(
        self,
        fields,
        base_tags: dict,
        clock_offset: Callable[[], float] = lambda: 0.0,
    ):
        self.ended: collections.deque = collections.deque(maxlen=MAX_PENDING)
        self._want = frozenset(n for m, n in fields if m == TASK)
        self._every = self._want >= FIELDS  # every field a record has: its dict is the point's, unfiltered
        self._tags, self._offset = dict(base_tags), clock_offset
        # with Dask's execute digests fed to fine.added (the worker plugin taps them)
        self.fine = FineMetrics(fields, base_tags) if (ACTIVITY, "value") in fields else None
        self._before: dict = {}  # series -> the ns written in it the previous tick (a set)

    def pending(self) -> bool:
        """Whether records (or Dask's digests, for activity points) wait for the next collect."""
        return bool(self.ended) or (self.fine is not None and self.fine.pending())

    def points(self, now_ns: int) -> list[Point]:
        """Drain the finished executions: their task points, then the activity points of this tick."""
        if not self.ended and (self.fine is None or not self.fine.pending()):
            return []  # nothing ended, nothing added (an idle worker costs one check)
        # digests first: a task's digests are added after its record, so every digest taken here
        # has its record drained below (a record whose digests come later waits for them)
        taken = self.fine.take() if self.fine else None
        pop, record = self.ended.popleft, self._record
        records = [record(pop()) for _ in range(len(self.ended))]  # those appended meanwhile: next tick
        records.sort(key=_BY_STOP)  # by end time: bumped timestamps keep their order
        out = self._points(records) if self._want else []
        if self.fine:
            out += self.fine.points(
                taken, [(series[2], series[0], duration) for _, series, duration, _ in records], now_ns
            )
        return out

    def _record(self, raw) -> tuple:
        """``(stop, (job, dag, prefix, state), duration, fields)``; stop on the scheduler's clock."""
        key, job, dag, end, ended_at = raw
        state, prefix, startstops, nbytes = end or _FORGOTTEN
        compute = spent = None
        for s in startstops:  # one pass: the last compute interval, the time spent otherwise
            action = s["action"]
            if action == "compute":
                compute = s
            elif action in SPENT:
                if spent is None:
                    spent = {"transfer": 0.0, "disk_read": 0.0, "disk_write": 0.0}
                spent[SPENT[action]] += float(s["stop"] - s["start"])
        if compute is not None:  # Dask's own interval, already on the scheduler's clock
            start, stop = compute["start"], compute["stop"]
        else:  # it never ran its function (failed before, rescheduled)
            start = stop = ended_at + self._offset()
        duration = float(stop - start)
        fields = {
            "key": str(key),
            "start": float(start),
            "duration": duration,
            "compute": duration,
            "transfer": 0.0,
            "disk_read": 0.0,
            "disk_write": 0.0,
        }
        if spent is not None:
            fields.update(spent)
        if nbytes is not None:
            fields["nbytes"] = int(nbytes)
        return stop, (job, dag, prefix or key_split(key), STATES.get(state, "cancelled")), duration, fields

    def _points(self, records: list) -> list[Point]:
        """The task points of ``records`` (sorted by end), one time per point and series: a time taken in its
        series this tick or the previous one moves on by 1 ns."""
        out, ticks, before, every, want = [], {}, self._before, self._every, self._want
        for stop, series, _, fields in records:
            tick = ticks.get(series)
            if tick is None:  # [tags, last ns, ns written, the previous tick's]: one tag dict per series and tick
                job, dag, prefix, state = series
                tags = {**self._tags, "job": str(job), "dag": str(dag), "prefix": prefix, "state": state}
                tick = ticks[series] = [tags, _NONE, set(), before.get(series, ())]
            t = round(stop * 1e9)
            if t <= tick[1]:  # sorted by end: only an equal time (or one moved on) gets here
                t = tick[1] + 1
            while t in tick[3]:
                t += 1
            tick[1] = t
            tick[2].add(t)
            if not every:
                fields = {k: v for k, v in fields.items() if k in want}
            out.append(Point(TASK, tick[0], fields, t))
        self._before = {series: tick[2] for series, tick in ticks.items()}
        return out
