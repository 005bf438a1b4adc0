"""Live figures: what a host's latest sample says of each worker, for the scheduler's dashboard page.

The sampler (the agent, or a worker sampling itself) keeps one small entry per worker, rebuilt from a
sample's points at most every :data:`LIVE_S`; the agent puts them in its beat (``live``: worker id ->
entry), each worker hands its own to the scheduler on its heartbeat (:mod:`..worker.heartbeat`), and the
scheduler's page state reads them (:mod:`..scheduler.livestate`). One entry (plain JSON and msgpack data)::

    {"jobs": [[job, tasks], ...],        # the jobs executing at the sample, with their tasks; [] = idle
     "prefixes": ["matmul", ...],        # the task prefixes executing (at most PREFIXES)
     "gpus": [[util, mem, total, sm, share, own], ...]}   # each GPU the worker uses, in its order

A GPU is known by its position in the worker's list: the scheduler has the worker's UUIDs in that order
already (the ``devices`` of the destinations each worker records), so no heartbeat carries them.
``util``, ``sm`` (GPM sm_active) and ``share`` are %, ``mem``, ``total`` and ``own`` (the worker's
own process tree) MiB, rounded; None where the sample has no such field (not tracked, not read on this
GPU). ``share`` is the worker's share of the GPU's kernel time on a shared GPU (``worker_gpu_share``,
kept :data:`SHARE_KEEP_S` between its once-a-second reads), None on a GPU only this worker uses (its own
figures are the device's), :data:`UNKNOWN` on a shared GPU with no recent share (its own figures cannot
be known then: left out, never guessed).

Example
-------
>>> from dask_influx_metrics.schema import Point
>>> from dask_influx_metrics.snapshot import Snapshot
>>> class View:
...     id, address, uuids = "7", "tcp://w:1", ["GPU-a"]
...     snapshot = staticmethod(lambda: Snapshot(((("inc-1", 0), 2, 5),), 1, 0, 2))
>>> gpu = Point("gpu", {"worker": "tcp://w:1", "uuid": "GPU-a"}, {"utilization_gpu": 87.4, "memory_used": 1024.4,
...     "memory_total": 81559.0}, 0)
>>> live = LiveFigures()
>>> live.update([View()], [gpu], now=0.0)
True
>>> live.entries["7"]
{'jobs': [[2, 1]], 'prefixes': ['inc'], 'gpus': [[87, 1024, 81559, None, None, None]]}
"""

from __future__ import annotations

import collections

from dask.utils import key_split

from ..schema import GPU

LIVE_S = 0.5  # the entries are rebuilt at most this often (Dask's shortest heartbeat interval)
SHARE_KEEP_S = 2.5  # a share read once a second stands for this long (as the readers take it)
PREFIXES = 3
UNKNOWN = -1  # share: a shared GPU whose worker share is not known now
GPU_COLUMNS = ("util", "mem", "total", "sm", "share", "own")
_FIELDS = ("utilization_gpu", "memory_used", "memory_total", "sm_active", "worker_gpu_share", "worker_memory_used")


def _round(value):
    return None if value is None else round(value)


class LiveFigures:
    """The latest entry per worker id (:attr:`entries`; see the module docstring)."""

    def __init__(self):
        self.entries: dict[str, dict] = {}
        self.version = 0  # changes when an entry does
        self._shares: dict[tuple, tuple] = {}  # (worker address, uuid) -> (share %, when)

    def observe(self, points, now: float) -> dict:
        """Note the shares a sample's ``points`` carry (every sample: a share is read once a second, an
        entry rebuilt every :data:`LIVE_S`); returns the sample's GPU readings by (worker address, uuid)."""
        readings: dict[tuple, dict] = {}
        for p in points:
            if p.measurement == GPU:
                key = (p.tags.get("worker"), p.tags.get("uuid"))
                readings[key] = p.fields
                if (share := p.fields.get("worker_gpu_share")) is not None:
                    self._shares[key] = (share, now)
        return readings

    def update(self, views, points, now: float, shared=()) -> bool:
        """Rebuild the entries of ``views`` from one sample's ``points`` (observed too); ``shared``: the uuids
        several workers use now. Whether anything changed."""
        readings = self.observe(points, now)
        self._shares = {k: v for k, v in self._shares.items() if now - v[1] <= SHARE_KEEP_S}
        entries = {v.id: self._entry(v, readings, shared) for v in views}
        if entries == self.entries:
            return False
        self.entries, self.version = entries, self.version + 1
        return True

    def _entry(self, view, readings: dict, shared) -> dict:
        running = view.snapshot().running
        jobs = collections.Counter(job for _, job, _ in running if job)
        prefixes = collections.Counter(key_split(k) for k, _, _ in running if k is not None)
        gpus = []
        for uuid in view.uuids:
            fields = readings.get((view.address, uuid), {})
            util, mem, total, sm, _, own = (fields.get(f) for f in _FIELDS)
            kept = self._shares.get((view.address, uuid))
            share = kept[0] if kept is not None else (UNKNOWN if uuid in shared else None)
            gpus.append([_round(util), _round(mem), _round(total), _round(sm), _round(share), _round(own)])
        return {
            "jobs": sorted([job, n] for job, n in jobs.items()),
            "prefixes": [p for p, _ in prefixes.most_common(PREFIXES)],
            "gpus": gpus,
        }
