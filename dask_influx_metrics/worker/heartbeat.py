"""What a worker adds to its own Dask heartbeat: its live figures, and Dask's GPU figures where Dask has none.

Dask calls each entry of ``Worker.metrics`` at every heartbeat and the scheduler keeps the result in
``WorkerState.metrics`` (:func:`.._dask.add_heartbeat_metric`): the figures reach the scheduler's
dashboard page (:mod:`..scheduler.livestate`) on a message the worker sends anyway, one per heartbeat
(0.5 s up to 10 workers, 2 s at 100), never one per sample. :data:`~..names.LIVE_METRIC` is this
worker's entry of :mod:`..sampling.live` (the host agent's latest, from its beat; in thread mode the
worker's own sampler's) plus its sampler's health::

    "agent": [host, pid, samples, age]     # the sampling process; seconds since its latest beat
    "sinks": [[kind, delivered, kept, lost], ...]  # its sinks' points (agents it replaced included)
    "acct": [[job, busy, energy, util, sm, mem, gpus], ...]  # its per-job accounting (sampling/live.py);
                                           # the agent's relay worker only (one per host), if kept

``gpu_utilization``, ``gpu_memory_used`` and ``gpu-memory-total`` are the figures Dask's own GPU charts
read (its first visible GPU, device-wide, bytes and an int %): ours are taken only where Dask's NVML gives
none (its diagnostics off or no GPU seen), since a core metric of the same name wins. An entry with
nothing to say raises, and Dask leaves it out of that heartbeat.

Example
-------
>>> beat = {"pid": 9, "samples": 40, "time": 0.0, "counters": [{"kind": "spool", "points_written": 5,
...     "points_dropped": 0}], "live": {"7": {"jobs": [], "prefixes": [], "gpus": [[50, 2, 4, None, None, None]]}}}
>>> entry = from_beat(beat, "7", "node1", now=1.5)
>>> entry["agent"], entry["sinks"]
(['node1', 9, 40, 1.5], [['spool', 5, 0, 0]])
>>> dask_gpu(entry)
{'gpu_utilization': 50, 'gpu_memory_used': 2097152, 'gpu-memory-total': 4194304}
"""

from __future__ import annotations

import logging
from typing import Callable

from .. import _dask
from ..names import LIVE_METRIC

logger = logging.getLogger(__name__)
MIB = 1 << 20
DASK_GPU = ("gpu_utilization", "gpu_memory_used", "gpu-memory-total")


def sinks(counters: list[dict]) -> list[list]:
    """``[[kind, delivered, kept, lost], ...]`` from sink counters (an agent's, and those of agents it
    replaced): ``kept`` on disk for replay or with the server's reason (HTTP's ``undelivered/`` and
    ``refused/``), ``lost`` neither delivered nor kept.

    >>> sinks([{"kind": "http", "points_written": 9, "points_failed": 3, "points_spooled": 2, "points_refused": 1}])
    [['http', 9, 3, 1]]
    """
    totals: dict[str, list] = {}
    for c in counters:
        row = totals.setdefault(c.get("kind", "?"), [0, 0, 0])
        kept = c.get("points_spooled", 0) + c.get("points_refused", 0)
        row[0] += c.get("points_sent", c.get("points_written", 0))
        row[1] += kept
        row[2] += c.get("points_dropped", max(0, c.get("points_failed", 0) - c.get("points_spooled", 0)))
    return [[kind, *row] for kind, row in sorted(totals.items())]


def from_beat(beat: dict | None, worker_id: str, host: str, now: float) -> dict | None:
    """This worker's heartbeat entry from its host agent's beat (``now``: ``time.monotonic()``)."""
    entry = (beat.get("live") or {}).get(worker_id) if beat else None
    if entry is None:
        return None
    agent = [host, beat["pid"], beat["samples"], round(now - beat["time"], 2)]
    entry = {**entry, "agent": agent, "sinks": sinks(beat.get("counters", []))}
    if beat.get("acct") is not None and beat.get("relay") == worker_id:  # the host's counters: one worker says
        entry["acct"] = beat["acct"]
    return entry


def dask_gpu(entry: dict | None) -> dict:
    """Dask's three GPU figures from this worker's first GPU (those the entry has)."""
    gpus = (entry or {}).get("gpus")
    if not gpus:
        return {}
    util, mem, total = gpus[0][:3]
    figures = {"gpu_utilization": util, "gpu_memory_used": mem, "gpu-memory-total": total}
    return {k: v * MIB if k != "gpu_utilization" else v for k, v in figures.items() if v is not None}


class Heartbeat:
    """Adds the entries to ``worker``'s heartbeat; ``latest()`` is this worker's entry now (or None)."""

    def __init__(self, worker, latest: Callable[[], dict | None]):
        self.worker, self.latest = worker, latest
        self._entries = {LIVE_METRIC: self._live, **{name: self._dask(name) for name in DASK_GPU}}
        try:
            for name, fn in self._entries.items():
                _dask.add_heartbeat_metric(worker, name, fn)
        except Exception as e:  # a Dask that moved Worker.metrics: no live figures, sampling goes on
            logger.warning("influx-metrics: cannot add the live figures to the heartbeat: %r", e)

    def _live(self, worker) -> dict:
        entry = self.latest()
        if entry is None:
            raise LookupError("no live figures yet")
        return entry

    def _dask(self, name: str) -> Callable:
        def figure(worker):
            return dask_gpu(self.latest())[name]  # KeyError: left out

        return figure

    def close(self) -> None:
        try:
            for name, fn in self._entries.items():
                _dask.remove_heartbeat_metric(self.worker, name, fn)
        except Exception:  # never added (said at setup)
            pass
