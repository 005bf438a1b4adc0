"""The dashboard page's state on the scheduler: each worker's latest figures, 5 minutes of each GPU's, per job.

Pure: fed every :data:`POLL_S` with what the workers' heartbeats carried (:func:`.._dask.heartbeats`;
each entry as :mod:`..worker.heartbeat` makes it), it takes each heartbeat once, and keeps

* per worker its latest entry, stamped with the scheduler's time of that heartbeat (one clock for all
  hosts; the sampler's health says how old its sample was then);
* per (worker, GPU position in its list) a strip of :data:`WINDOW_S` of ``(time, util, mem, total, jobs,
  prefixes)``;
* per sampling process (host, pid) its health: samples, points delivered and lost, its last sample.

:meth:`LiveState.jobs` adds up the latest entries per job: a worker's GPU figures go to the jobs executing
there, in proportion to their tasks; on a shared GPU its own share of the device's utilization and SM
active (the device's x the worker's ``share``), so the jobs of a GPU add up to at most the device's
figure; memory is what the worker's own processes hold (a worker running two jobs counts for both, as the
accounting counts it). A figure one of its workers cannot give (not
tracked, no GPM, a shared GPU's share not known now) is left out of the job's row (None), never
guessed. Where a host's sampler keeps the per-job accounting (``acct``, its relay worker's heartbeat), the
job's busy GPU-seconds and energy are its counters summed over the samplers, and its "now" figures those
of the accounting's latest settled windows (one rule with the totals: a share that covers the window,
not the latest share read). An entry older than :data:`STALE_S` is not "now" (a worker gone, a session stopped).

Example
-------
>>> state = LiveState()
>>> entry = {"jobs": [[1, 2]], "prefixes": ["mm"], "gpus": [[80, 900, 1000, None, 50, 300]],
...     "agent": ["node1", 42, 100, 0.1], "sinks": [["spool", 500, 0, 0]]}
>>> state.update([("tcp://w:1", 100.0, entry)], now=100.0)
1
>>> [(r["job"], r["util"], r["sm"], r["mem"], r["gpus"]) for r in state.jobs(now=101.0)]
[(1, 40.0, None, 300.0, 1)]
"""

from __future__ import annotations

import collections
import logging
import math

from ..sampling.live import UNKNOWN

logger = logging.getLogger(__name__)
POLL_S = 0.5  # how often the scheduler looks at the heartbeats (Dask's shortest interval)
WINDOW_S = 300.0  # the strips' length
STALE_S = 10.0  # an entry older than this is not "now" (heartbeats come every 0.5-2 s up to 200 workers)
FIGURES = ("util", "sm", "mem")


class LiveState:
    """See the module docstring."""

    def __init__(self, window: float = WINDOW_S):
        self.window = window
        self.workers: dict[str, tuple[float, dict]] = {}  # address -> (heartbeat time, entry)
        self.strips: dict[tuple, collections.deque] = {}  # (address, GPU position) -> (t, util, mem, total, jobs, ...)
        self.hosts: dict[tuple, tuple] = {}  # (host, pid) -> (heartbeat time, sample age, samples, sinks)
        self.accounting: dict[tuple, Counters] = {}  # (host, pid) -> its sampler's per-job accounting
        self.taken = 0  # entries taken so far: a page redraws when it changed
        self.refused = 0  # entries that were not of this version's shape (left out)
        self._seen: dict[str, float] = {}  # address -> the heartbeat time of the entry taken

    def update(self, heartbeats, now: float) -> int:
        """Take the entries of heartbeats not seen yet (``(address, heartbeat time, entry or None)``);
        returns how many."""
        taken = 0
        for address, seen, entry in heartbeats:
            if entry is None or self._seen.get(address) == seen:
                continue
            self._seen[address] = seen
            try:
                self._take(address, seen, entry)
            except (KeyError, TypeError, ValueError, IndexError) as e:  # not an entry of this version: left out
                if not self.refused:
                    logger.warning("influx-metrics: a heartbeat entry of %s left out (%r; said once)", address, e)
                self.refused += 1
                continue
            taken += 1
        if taken:
            self.taken += taken
            self._forget(now)
        return taken

    def _take(self, address: str, t: float, entry: dict) -> None:
        """Check the entry's shape, then keep it (a malformed one changes nothing)."""
        jobs = ",".join(str(int(j)) for j, _ in entry.get("jobs", ()))
        prefixes = ", ".join(str(p) for p in entry.get("prefixes", ()))
        bars = [(t, util, mem, total, jobs, prefixes) for util, mem, total, _, _, _ in entry.get("gpus", ())]
        host, pid, samples, age = entry["agent"]
        acct = entry.get("acct")
        if acct is not None and any(len(row) != 7 for row in acct):
            raise ValueError("an accounting row of another shape")
        self.workers[address] = (t, entry)
        for i, bar in enumerate(bars):
            strip = self.strips.get((address, i))
            if strip is None:
                strip = self.strips[address, i] = collections.deque()
            strip.append(bar)
            while strip[0][0] < t - self.window:
                strip.popleft()
        self.hosts[host, pid] = (t, age, samples, entry.get("sinks", []))
        if acct is not None:
            self.accounting.setdefault((host, pid), Counters()).take(t, acct)

    def _forget(self, now: float) -> None:
        """Strips and workers with nothing in the window (workers gone)."""
        old = now - self.window
        for key in [k for k, s in self.strips.items() if s[-1][0] < old]:
            del self.strips[key]
        for address in [a for a, (t, _) in self.workers.items() if t < old]:
            del self.workers[address], self._seen[address]

    def fresh(self, now: float) -> dict[str, dict]:
        """The entries that are "now": address -> entry."""
        return {a: e for a, (t, e) in self.workers.items() if now - t <= STALE_S}

    def jobs(self, now: float, book=None) -> list[dict]:
        """One row per job (those of ``book``, a :class:`.jobs.JobBook`, and those running now): ``job``,
        ``label``, ``util`` and ``sm`` (% of one GPU, summed over its GPUs: 250 = two and a half GPUs busy),
        ``mem`` (MiB its workers' processes hold), ``gpus`` (where it runs now), ``busy_s`` and ``energy_j``
        (the agents' accounting counters so far), ``dags`` (running DAG numbers); None: cannot be known."""
        rows: dict[int, dict] = {}

        def row(job: int) -> dict:
            if job not in rows:
                rows[job] = {"job": job, "label": "", "util": 0.0, "sm": 0.0, "mem": 0.0, "gpus": 0, "dags": []}
                rows[job].update(busy_s=None, energy_j=None)
            return rows[job]

        covered = {key for key, c in self.accounting.items() if now - c.t <= STALE_S}
        for entry in self.fresh(now).values():  # hosts whose sampler keeps no accounting: from the entries
            tasks = sum(n for _, n in entry.get("jobs", ()))
            if not tasks or tuple(entry["agent"][:2]) in covered:
                continue
            for job, n in entry.get("jobs", ()):
                r, weight = row(job), n / tasks
                for util, _, _, sm, share, own in entry.get("gpus", ()):
                    scale = None if share == UNKNOWN else 1.0 if share is None else share / 100.0
                    _add(r, "util", util, scale, weight)
                    _add(r, "sm", sm, scale, weight)
                    _add(r, "mem", own, 1.0, 1.0)  # what its workers' processes hold: theirs whole
                    r["gpus"] += 1
        unknown = set()  # (job, figure) a sampler cannot give yet: the sum is not known either
        for key, counters in self.accounting.items():  # the samplers' counters (and "now" where fresh)
            for job, (busy, energy, util, sm, mem, gpus) in counters.jobs.items():
                r = row(job)
                for figure, value in (("busy_s", busy), ("energy_j", energy)):
                    if value is None:
                        unknown.add((job, figure))
                    else:
                        r[figure] = (r[figure] or 0.0) + value
                if key in covered and job in counters.now:
                    _add(r, "util", util, 1.0, 1.0)
                    _add(r, "sm", sm, 1.0, 1.0)
                    _add(r, "mem", mem, 1.0, 1.0)
                    r["gpus"] += gpus
        for job, figure in unknown:
            rows[job][figure] = None
        if book is not None:
            for number, job in book.jobs.items():
                row(number)["label"] = job.label
            for number in book.running_dags():
                row(book.dags[number].job)["dags"].append(number)
        return [rows[j] for j in sorted(rows)]

    def health(self, now: float) -> list[dict]:
        """One row per sampling process: ``host``, ``pid``, ``samples``, ``sinks`` (``[[kind, delivered,
        kept, lost], ...]``), ``age`` (seconds since its latest sample, now)."""
        return [
            {"host": host, "pid": pid, "samples": samples, "sinks": sinks, "age": max(0.0, now - t + age)}
            for (host, pid), (t, age, samples, sinks) in sorted(self.hosts.items())
            if now - t <= self.window
        ]


class Counters:
    """One sampler's per-job accounting as its heartbeats carried it (rows ``[job, busy in 0.01 s, energy J,
    util, sm, mem, gpus]``, :mod:`..sampling.live`; None: not known yet). A job whose rows the sampler dropped
    (``accounting.retention`` after it last ran there) keeps its last totals here; a job whose totals went down
    (dropped, then run again: counted from 0) adds its new count to the old, as Prometheus's ``increase`` takes
    a counter reset.

    >>> c = Counters()
    >>> c.take(1.0, [[7, 500, 90, 50, 40, 10, 1]]); c.take(2.0, []); c.jobs[7][:2], c.now
    ((5.0, 90.0), set())
    >>> c.take(3.0, [[7, 100, 10, 80, 70, 10, 1]]); c.jobs[7][:2], c.now
    ((6.0, 100.0), {7})
    >>> c.take(4.0, [[8, 100, None, 80, 70, 10, 1]]); c.jobs[8][:2]  # its energy not known yet
    (1.0, None)
    """

    def __init__(self):
        self.t = 0.0  # the heartbeat time of the latest rows
        self.jobs: dict[int, tuple] = {}  # job -> (busy s, energy J, util, sm, mem, gpus)
        self.now: set = set()  # the jobs of the latest rows
        self._base: dict[int, tuple] = {}  # job -> (busy, energy) of its rows before they were counted anew
        self._last: dict[int, tuple] = {}  # job -> (busy, energy) of its latest rows as sent

    def take(self, t: float, rows) -> None:
        self.t, self.now = t, {row[0] for row in rows}
        for job, busy, energy, util, sm, mem, gpus in rows:
            now = (None if busy is None else busy / 100, None if energy is None else float(energy))
            last = self._last.get(job)
            if last is not None and any(a is not None and b is not None and a < b for a, b in zip(now, last)):
                self._base[job] = _plus(self._base.get(job, (0.0, 0.0)), last)  # counted anew from 0
            self._last[job] = now
            self.jobs[job] = (*_plus(self._base.get(job, (0.0, 0.0)), now), util, sm, mem, gpus)


def _plus(a: tuple, b: tuple) -> tuple:
    """Element-wise sum of two ``(busy, energy)``; None where either is not known."""
    return tuple(None if x is None or y is None else x + y for x, y in zip(a, b))


def _add(row: dict, figure: str, value, scale, weight: float) -> None:
    """Add ``value x scale x weight`` to ``row[figure]``; an unknown part makes the whole unknown."""
    if row[figure] is None:
        return
    row[figure] = None if value is None or scale is None else row[figure] + value * scale * weight


def formatted(row: dict) -> dict:
    """A job row's figures as text (the page's table, ``Monitor._repr_html_``); "-" where unknown."""

    def text(value, unit: str, digits: int = 0) -> str:
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}{unit}"

    return {
        "job": str(row["job"]),
        "label": row["label"],
        "util": text(row["util"], " %"),
        "sm": text(row["sm"], " %"),
        "mem": text(None if row["mem"] is None else row["mem"] / 1024, " GiB", 2),
        "gpus": str(row["gpus"]),
        "busy": text(row["busy_s"], " s", 1),
        "energy": text(None if row["energy_j"] is None else row["energy_j"] / 1000, " kJ", 2),
        "dags": ", ".join(map(str, row["dags"])) or "-",
    }
