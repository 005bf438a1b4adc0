"""Dask's fine performance metrics per job: ``activity`` points (tracking name ``fine-metrics``).

Dask adds, per worker, what executing a task spent on each activity when the
execution ends (``digest_metric(("execute", span, prefix, activity, unit),
amount)``: thread-cpu, thread-noncpu, disk-read, executor, custom
``context_meter`` labels, ...; the names change between releases, so none is
written down here). The worker plugin taps those calls (``_dask.tap_execute_digests``):
each amount is appended to :attr:`FineMetrics.added` on the event loop, and once
per tick this sums what was added since the previous tick per prefix and writes
it per job; only non-zero amounts. Reading the additions, not Dask's running
totals, keeps a tick's cost to what happened since the last one: the totals
grow by ~20 entries per computation for the worker's life (a span each, x its
prefixes x activities), and diffing them every tick cost 538 us at 2,900
entries, 7.6 ms at 32,000 (docs/performance.md).

**Attribution to jobs.** Dask adds a task's amounts right after the worker
plugin recorded the end of its execution. So what was added to prefix ``p``
belongs to the tasks of ``p`` that ended since ``p``'s previous addition: when
all of them belong to one job, the whole amount is that job's (exact, ``jobs =
1``); when they belong to several, it is split between those jobs in proportion
to their tasks' execution time (``jobs`` = how many). An addition with no
recorded task end goes to the jobs of the last split of that prefix, else to
job 0.

Example
-------
>>> from dask_influx_metrics.schema import TRACKING
>>> fine = FineMetrics(frozenset(TRACKING["fine-metrics"]), {"worker": "w"})
>>> fine.added.append(("inc", "thread-cpu", "seconds", 3.0))
>>> for p in fine.points(fine.take(), [("inc", 1, 0.2), ("inc", 2, 0.1)], now_ns=0):
...     print(p.tags["job"], round(p.fields["value"], 3), p.fields["jobs"])
1 2.0 2
2 1.0 2
"""

from __future__ import annotations

import collections

from ..schema import ACTIVITY, Point

NO_JOB = {0: 1.0}
MAX_ADDED = 200_000  # additions held between two ticks at most (~8 per task; the oldest go first)


class FineMetrics:
    """What Dask's execute digests added between ticks, split per job."""

    def __init__(self, fields, base_tags: dict):
        # (prefix, activity, unit, amount), appended on the event loop by the tap
        self.added: collections.deque = collections.deque(maxlen=MAX_ADDED)
        self._want = frozenset(n for m, n in fields if m == ACTIVITY)
        self._tags = dict(base_tags)
        self._weights: dict = {}  # prefix -> {job: execution seconds} of ended tasks not yet matched
        self._split: dict = {}  # prefix -> the weights of its last split

    def take(self) -> list:
        """The additions since the previous take (popped one by one: the event loop appends meanwhile)."""
        pop = self.added.popleft
        return [pop() for _ in range(len(self.added))]

    def pending(self) -> bool:
        """Whether additions wait, or ended tasks wait for theirs (Dask adds them after the task's record)."""
        return bool(self.added or self._weights)

    def points(self, taken: list, ended, now_ns: int) -> list[Point]:
        """Activity points for the additions ``taken``; ``ended``: ``(prefix, job, execution seconds)``
        of the task executions ended since the previous call."""
        for prefix, job, seconds in ended:
            weights = self._weights.setdefault(prefix, collections.Counter())
            weights[job] += max(seconds, 0.0)
        out = []
        for prefix, amounts in _sums(taken).items():
            split = self._weights.pop(prefix, None) or self._split.get(prefix) or NO_JOB
            self._split[prefix] = split
            total = sum(split.values())
            for job, weight in sorted(split.items()):
                share = weight / total if total > 0 else 1.0 / len(split)
                tags = {**self._tags, "job": str(job), "prefix": prefix}
                for (activity, unit), amount in amounts.items():
                    if amount * share:
                        fields = {"value": float(amount * share), "jobs": len(split)}
                        out.append(
                            Point(
                                ACTIVITY,
                                {**tags, "activity": activity, "unit": unit},
                                {k: v for k, v in fields.items() if k in self._want},
                                now_ns,
                            )
                        )
        return out


def _sums(taken: list) -> dict:
    """{prefix: {(activity, unit): amount}} of the non-zero sums."""
    sums: dict = {}
    for prefix, activity, unit, amount in taken:
        by = sums.setdefault(prefix, {})
        by[activity, unit] = by.get((activity, unit), 0) + amount
    return {p: {k: v for k, v in by.items() if v} for p, by in sums.items() if any(by.values())}
