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

Beside them, :attr:`LiveFigures.accounting`: the sampler's per-job accounting counters
(:class:`.accounting.Accounting`, when ``accounting`` is tracked) as one row per job, summed over its GPUs:
``[job, busy, energy, util, sm, mem, gpus]``: busy GPU-seconds in hundredths (an int: fewer bytes on
the heartbeat), energy in J (None: not known yet on one of its GPUs, :func:`accounting_rows`), then the
job's own figures of the latest settled windows (``util`` and ``sm`` % of one GPU, summed; ``mem`` MiB its
workers hold; None: not known) and the GPUs it ran on there.

Example
-------
>>> from dask_influx_metrics.schema import Point
>>> from dask_influx_metrics.link.snapshot import Snapshot
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

from ..names import key_prefix
from ..schema import GPU

LIVE_S = 0.5  # the entries are rebuilt at most this often (Dask's shortest heartbeat interval)
SHARE_KEEP_S = 2.5  # a share read once a second stands for this long (as the readers take it)
PREFIXES = 3
UNKNOWN = -1  # share: a shared GPU whose worker share is not known now
MIB = 2.0**20
GPU_COLUMNS = ("util", "mem", "total", "sm", "share", "own")
_FIELDS = ("utilization_gpu", "memory_used", "memory_total", "sm_active", "worker_gpu_share", "worker_memory_used")


def _round(value):
    return None if value is None else round(value)


class LiveFigures:
    """The latest entry per worker id (:attr:`entries`; see the module docstring)."""

    def __init__(self):
        self.entries: dict[str, dict] = {}
        self.accounting: list | None = None  # per job: [job, busy 0.01 s, energy J, util, sm, mem MiB, gpus]
        self.version = 0  # changes when an entry or the accounting does
        self._shares: dict[tuple, tuple] = {}  # (worker address, uuid) -> (share %, when)

    def observe(self, points, now: float) -> None:
        """Note the shares a sample's ``points`` carry (every sample: a share is read once a second, an
        entry rebuilt every :data:`LIVE_S`)."""
        for p in points:
            if p.measurement == GPU and (share := p.fields.get("worker_gpu_share")) is not None:
                self._shares[p.tags.get("worker"), p.tags.get("uuid")] = (share, now)

    def update(self, views, points, now: float, shared=()) -> bool:
        """Rebuild the entries of ``views`` from one sample's ``points`` (observed too); ``shared``: the uuids
        several workers use now. Whether anything changed."""
        self.observe(points, now)
        readings = {(p.tags.get("worker"), p.tags.get("uuid")): p.fields for p in points if p.measurement == GPU}
        self._shares = {k: v for k, v in self._shares.items() if now - v[1] <= SHARE_KEEP_S}
        entries = {v.id: self._entry(v, readings, shared) for v in views}
        if entries == self.entries:
            return False
        self.entries, self.version = entries, self.version + 1
        return True

    def account(self, live: dict | None) -> bool:
        """Take the accounting's totals and "now" figures (:meth:`.accounting.Accounting.live`; None: not
        kept); whether they changed."""
        rows = None if live is None else accounting_rows(live)
        if rows == self.accounting:
            return False
        self.accounting, self.version = rows, self.version + 1
        return True

    def _entry(self, view, readings: dict, shared) -> dict:
        running = view.snapshot().running
        jobs, prefixes = [], []
        if running:
            counts = collections.Counter(job for _, job, _ in running if job)
            jobs = sorted([job, n] for job, n in counts.items())
            common = collections.Counter(key_prefix(k) for k, _, _ in running if k is not None).most_common(PREFIXES)
            prefixes = [p for p, _ in common]
        gpus = []
        for uuid in view.uuids:
            fields = readings.get((view.address, uuid), {})
            util, mem, total, sm, _, own = [fields.get(f) for f in _FIELDS]
            kept = self._shares.get((view.address, uuid))
            share = kept[0] if kept is not None else (UNKNOWN if uuid in shared else None)
            gpus.append([None if v is None else round(v) for v in (util, mem, total, sm, share, own)])
        return {"jobs": jobs, "prefixes": prefixes, "gpus": gpus}


def accounting_rows(live: dict) -> list:
    """One row per job (see :attr:`LiveFigures.accounting`) from :meth:`.accounting.Accounting.live`.

    >>> accounting_rows({"jobs": {"3": {"gpus": {"GPU-a": {"busy_seconds": 12.34, "energy_joules": 4567.8},
    ...     "GPU-b": {"busy_seconds": 1.0, "energy_joules": 100.0}}, "now": {"GPU-a": {"utilization_gpu": 87.0,
    ...     "sm_active": None, "memory_bytes": 2 ** 30}}}}})
    [[3, 1334, 4668, 87, None, 1024, 1]]

    A total one of its GPUs cannot give yet is None, never a part taken for the whole: energy until the GPU's
    energy counter was read since the job began there (every 10 s), or on a GPU with no power reading.

    >>> accounting_rows({"jobs": {"3": {"gpus": {"GPU-a": {"busy_seconds": 2.0, "energy_joules": 400.0},
    ...     "GPU-b": {"busy_seconds": 1.0}}}}})[0][:3]
    [3, 300, None]
    """
    rows = []
    for job, row in live.get("jobs", {}).items():
        totals = row.get("gpus", {}).values()
        busy, energy = (_sum(t.get(f) for t in totals) for f in ("busy_seconds", "energy_joules"))
        now = list(row.get("now", {}).values())
        util, sm, mem = (_sum(n.get(f) for n in now) for f in ("utilization_gpu", "sm_active", "memory_bytes"))
        busy = None if busy is None else round(busy * 100)
        rows.append([int(job), busy, _round(energy), _round(util), _round(sm), _round(mem and mem / MIB), len(now)])
    return sorted(rows)


def _sum(values):
    """The sum, or None when one of them is not known."""
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total
