"""Dask's fine performance metrics per job: ``activity`` points (tracking name ``fine-metrics``).

Dask adds up, per worker, what executing tasks spent on each activity
(``digests_total[("execute", span, prefix, activity, unit)]``: thread-cpu,
thread-noncpu, disk-read, executor, custom ``context_meter`` labels, ...; the
names change between releases, so none is written down here). Once per tick
this takes the increase of every such entry since the previous tick (summed
over spans) and writes it per job and prefix; only non-zero amounts.

**Attribution to jobs.** Dask adds a task's amounts when its execution ends,
right after the worker plugin recorded the end. So the increase of prefix ``p``
belongs to the tasks of ``p`` that ended since the previous increase of ``p``:
when all of them belong to one job, the whole amount is that job's (exact,
``jobs = 1``); when they belong to several, it is split between those jobs in
proportion to their tasks' execution time (``jobs`` = how many). An increase
with no recorded task end (its task ended before the session) goes to the jobs
of the last split of that prefix, else to job 0.

Example
-------
>>> from dask_influx_metrics.schema import TRACKING
>>> digests = {("execute", "span-1", "inc", "thread-cpu", "seconds"): 0.0}
>>> fine = FineMetrics(lambda: dict(digests), frozenset(TRACKING["fine-metrics"]), {"worker": "w"})
>>> digests[("execute", "span-1", "inc", "thread-cpu", "seconds")] = 3.0
>>> for p in fine.points(fine.snapshot(), [("inc", 1, 0.2), ("inc", 2, 0.1)], now_ns=0):
...     print(p.tags["job"], round(p.fields["value"], 3), p.fields["jobs"])
1 2.0 2
2 1.0 2
"""

from __future__ import annotations

import collections
from typing import Callable

from .._dask import execute_digest
from ..schema import ACTIVITY, Point

NO_JOB = {0: 1.0}


class FineMetrics:
    """Deltas of the worker's ``execute`` digests between ticks, split per job."""

    def __init__(self, digests: Callable[[], dict], fields, base_tags: dict):
        self._digests = digests
        self._want = frozenset(n for m, n in fields if m == ACTIVITY)
        self._tags = dict(base_tags)
        self._last = digests()  # what ran before monitoring is not reported
        self._weights: dict = {}  # prefix -> {job: execution seconds} of ended tasks not yet matched
        self._split: dict = {}  # prefix -> the weights of its last split

    def snapshot(self) -> dict:
        return self._digests()

    def waiting(self) -> bool:
        """Whether ended tasks wait for their digests (which Dask adds after the task's record)."""
        return bool(self._weights)

    def points(self, snapshot: dict, ended, now_ns: int) -> list[Point]:
        """Activity points for the increase from the previous snapshot to ``snapshot``;
        ``ended``: ``(prefix, job, execution seconds)`` of the task executions ended since."""
        for prefix, job, seconds in ended:
            weights = self._weights.setdefault(prefix, collections.Counter())
            weights[job] += max(seconds, 0.0)
        out = []
        for prefix, deltas in self._deltas(snapshot).items():
            split = self._weights.pop(prefix, None) or self._split.get(prefix) or NO_JOB
            self._split[prefix] = split
            total = sum(split.values())
            for job, weight in sorted(split.items()):
                share = weight / total if total > 0 else 1.0 / len(split)
                tags = {**self._tags, "job": str(job), "prefix": prefix}
                for (activity, unit), delta in deltas:
                    if delta * share:
                        fields = {"value": float(delta * share), "jobs": len(split)}
                        out.append(
                            Point(
                                ACTIVITY,
                                {**tags, "activity": activity, "unit": unit},
                                {k: v for k, v in fields.items() if k in self._want},
                                now_ns,
                            )
                        )
        return out

    def _deltas(self, snapshot: dict) -> dict:
        """{prefix: [((activity, unit), increase), ...]} of the execute digests that grew."""
        last, out = self._last, {}
        changed = snapshot.items() - last.items()  # a set operation in C: the loop sees changes only
        sums: dict = collections.defaultdict(float)
        for key, value in changed:
            parsed = execute_digest(key)
            if parsed is not None:
                delta = value - last.get(key, 0)
                sums[parsed] += value if delta < 0 else delta  # below the last: Dask reset it
        self._last = snapshot
        for (prefix, activity, unit), delta in sums.items():
            if delta:
                out.setdefault(prefix, []).append(((activity, unit), delta))
        return out
