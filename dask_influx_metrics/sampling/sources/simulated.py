"""A simulated GPU that follows what the worker really runs.

It lets every code path above NVML (sampling, tags, custom per-device metrics,
encoding, sinks, queries, dashboards) run on a machine without a GPU. Readings
have the same shape and tags as :class:`.nvml.NvmlSource`; the name is
``Simulated GPU`` and the UUID ``SIM-...`` is stable per (host, worker process,
index).

Model, per read and per device ``i``. Like NVML's, utilization (and what derives from it: memory
utilization, power, temperature, clock) is an **average over the time since the previous read**;
memory is **as now**:

* ``busy``: the share of the worker's threads executing tasks since the previous read, from the
  worker's busy-time counter (:attr:`~dask_influx_metrics.link.snapshot.Snapshot.busy`, kept with one
  clock read per task start and end): exact however short the tasks. Where the worker does not count it (and at the first read),
  ``min(1, executing / nthreads)`` at the read (0 when the worker has no threads)
* ``utilization_gpu = round(100 * busy * (1 - j))`` with ``j`` a seeded jitter
  in ``[0, 0.08]`` (a fixed per-device part plus a per-read part), so an idle
  worker reads exactly 0 and a saturated one 92..100
* ``utilization_memory = 0.6 * utilization_gpu``
* ``memory_used = 400 MiB + managed_bytes / 2**20 / count``, capped at
  ``memory_total``; ``memory_used_percent`` from those two
* ``power_draw = 60 W + 340 W * u`` with ``u = utilization_gpu / 100``
* ``temperature_gpu`` moves 30 % of the way per read towards ``35 + 45 * u`` C
  (starting at 35), like a heat sink
* ``clocks_current_sm = 1410 MHz`` when ``u > 0``, else ``210 MHz``
* ``total_energy_consumption`` (mJ): a counter that adds ``power_draw`` x the time since the previous
  read, starting at 1e6 mJ; like NVML's, it is in the reading of the first read, then every
  :data:`~.slowfields.COUNTER_INTERVAL_S` and on a final read (a worker's or the session's last)

The same seed and the same tasks give the same readings.

Example
-------
>>> from dask_influx_metrics.link.snapshot import Snapshot
>>> idle = lambda: Snapshot(running=(), nthreads=2, managed_bytes=0, last_job=0)
>>> src = SimulatedGpuSource(1, frozenset({("gpu", "utilization_gpu"), ("gpu", "power_draw")}), idle)
>>> src.read()[0].fields
{'utilization_gpu': 0.0, 'power_draw': 60.0}
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
import time
from typing import Callable, NamedTuple

from ...link.snapshot import Snapshot
from ...schema import GPU, Reading
from .slowfields import COUNTER_INTERVAL_S

NAME = "Simulated GPU"
BASE_MIB = 400.0
IDLE_W, MAX_W = 60.0, 400.0
COOL_C, HOT_C = 35.0, 80.0
BUSY_MHZ, IDLE_MHZ = 1410.0, 210.0
JITTER = 0.08  # at most this fraction below 100 % * busy
SMOOTHING = 0.3  # fraction of the way to the target temperature per read
ENERGY_START_MJ = 1_000_000  # the energy counter's value before the first read
_MIB = float(2**20)


class SimulatedHandle(NamedTuple):
    """What a per-device custom metric receives for a simulated device."""

    index: int
    uuid: str


def simulated_uuid(index: int, host: str | None = None, pid: int | None = None) -> str:
    """``SIM-`` plus a UUID-shaped digest of (host, pid, index).

    >>> simulated_uuid(0, "node1", 42)
    'SIM-6265069f-4f55-1493-a720-6fc01769aae2'
    """
    host = socket.gethostname() if host is None else host
    pid = os.getpid() if pid is None else pid
    h = hashlib.sha1(f"{host}/{pid}/{index}".encode()).hexdigest()
    return f"SIM-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class SimulatedGpuSource:
    """``count`` simulated devices whose readings follow ``snapshot()``.

    ``fields`` holds ``(measurement, field)`` pairs; only the requested ``gpu``
    fields are computed and returned. ``pid``: the worker process the UUIDs
    belong to (default this one; the agent passes the worker's). ``clock``: the clock of the worker's
    busy time (``time.monotonic``, one clock for every process of a Linux host).

    >>> snap = Snapshot((), 1, 0, 0, busy=0.0)  # idle so far
    >>> now = [10.0]
    >>> src = SimulatedGpuSource(1, frozenset({("gpu", "utilization_gpu")}), lambda: snap, clock=lambda: now[0])
    >>> src.read()[0].fields["utilization_gpu"]
    0.0
    >>> snap = Snapshot((), 1, 0, 0, busy=10.13 - 10.1)  # a 30 ms task (10.1 to 10.13 s), then idle
    >>> now[0] = 10.2; src.read()[0].fields["utilization_gpu"]  # 15 % of the 200 ms since the last read, less jitter
    14.0
    """

    def __init__(
        self,
        count: int,
        fields: frozenset,
        snapshot: Callable[[], Snapshot],
        memory_total_mib: float = 81920.0,
        seed: int = 0,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if count < 0:
            raise ValueError(f"simulated GPU count must be >= 0, got {count}")
        self._want = frozenset(name for m, name in fields if m == GPU)
        self._snapshot = snapshot
        self._total = float(memory_total_mib)
        self._rng = random.Random(seed)
        self._offset = [self._rng.uniform(0, JITTER / 2) for _ in range(count)]
        self._temp = [COOL_C] * count
        self._handles = [SimulatedHandle(i, simulated_uuid(i, pid=pid)) for i in range(count)]
        self._tags = [{"index": str(i), "uuid": h.uuid, "name": NAME} for i, h in enumerate(self._handles)]
        self._clock, self._last = clock, None  # (time, busy seconds) at the previous read
        self._energy = [float(ENERGY_START_MJ)] * count  # mJ so far, per device
        self._energy_at: float | None = None  # time of the previous read (the counter's integration)
        self._energy_due = None  # when the counter is written next (None: at the next read)

    def _busy(self, snap: Snapshot) -> float:
        """The worker's busy share since the previous read; at a read where that is unknown, now."""
        now = self._clock()
        total = None if snap.busy is None else snap.busy + snap.busy_n * now  # busy thread-seconds so far
        last, self._last = self._last, (None if total is None else (now, total))
        if total is None or last is None or now <= last[0] or snap.nthreads <= 0:
            return min(1.0, snap.executing / snap.nthreads) if snap.nthreads > 0 else 0.0
        return min(1.0, max(0.0, (total - last[1]) / ((now - last[0]) * snap.nthreads)))

    def read(self, final: bool = False) -> list[Reading]:
        """One ``gpu`` reading per simulated device; ``final``: the energy counter is in it, whenever it
        was last."""
        if not self._want or not self._handles:
            return []
        snap = self._snapshot()
        now = self._clock()
        busy = self._busy(snap)
        dt, self._energy_at = (0.0 if self._energy_at is None else max(0.0, now - self._energy_at)), now
        counter = "total_energy_consumption" in self._want and (
            final or self._energy_due is None or now >= self._energy_due
        )
        if counter:
            self._energy_due = now + COUNTER_INTERVAL_S
        count = len(self._handles)
        used = min(self._total, BASE_MIB + snap.managed_bytes / _MIB / count)
        want = self._want
        readings = []
        for i in range(count):
            jitter = self._offset[i] + self._rng.uniform(0, JITTER / 2)
            util = float(round(100.0 * busy * (1.0 - jitter)))
            u = util / 100.0
            self._temp[i] += SMOOTHING * (COOL_C + (HOT_C - COOL_C) * u - self._temp[i])
            values = {
                "utilization_gpu": util,
                "utilization_memory": round(0.6 * util, 1),
                "memory_used": used,
                "memory_total": self._total,
                "memory_used_percent": 100.0 * used / self._total if self._total else 0.0,
                "power_draw": round(IDLE_W + (MAX_W - IDLE_W) * u, 3),
                "temperature_gpu": round(self._temp[i], 2),
                "clocks_current_sm": BUSY_MHZ if u > 0 else IDLE_MHZ,
            }
            self._energy[i] += values["power_draw"] * dt * 1000.0  # W x s -> mJ
            if counter:
                values["total_energy_consumption"] = int(self._energy[i])
            readings.append(Reading(GPU, dict(self._tags[i]), {k: v for k, v in values.items() if k in want}))
        return readings

    @property
    def handles(self) -> list[SimulatedHandle]:
        """One :class:`SimulatedHandle` per device, for custom metrics."""
        return list(self._handles)

    @property
    def devices(self) -> list[tuple[int, str, str]]:
        """``(index, uuid, name)`` per device, as :class:`.nvml.NvmlSource` has."""
        return [(h.index, h.uuid, NAME) for h in self._handles]

    def close(self) -> None:
        """Nothing to release."""
