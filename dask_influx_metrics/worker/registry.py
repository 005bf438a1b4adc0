"""What the worker is doing: executing tasks, their job/DAG, bytes held (in-process).

The worker plugin feeds :class:`TaskRegistry` from ``WorkerPlugin.transition``
(on the event loop); an in-process sampler (``sampler.mode: thread``, custom
metrics, the task stream) reads consistent snapshots under a lock, so it never
touches the worker's own state machine. The agent reads the same snapshots from
the worker's published copy instead (:class:`..link.snapshot.Publisher`).

Example
-------
>>> reg = TaskRegistry(nthreads=2)
>>> reg.started(("x", 0), job=1, dag=3)
>>> snap = reg.snapshot()
>>> snap.executing, snap.job_tag, snap.dag_tag
(1, '1', '3')
>>> reg.ended(("x", 0))
(1, 3)
>>> reg.snapshot().dag_tag
'0'
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from ..link.snapshot import Snapshot


class TaskRecord(Protocol):
    """Where the worker plugin records task starts and ends, on the event loop: the in-process
    :class:`TaskRegistry`, the agent's :class:`~..link.snapshot.Publisher`, or both (:class:`Both`)."""

    def started(self, key, job: int, dag: int) -> None: ...

    def ended(self, key) -> tuple[int, int] | None:
        """The task's ``(job, dag)``; None if it was not executing."""

    def idle(self) -> bool:
        """Whether no task is executing."""


class Both:
    """Two records fed alike: beside the agent, its publisher and the registry the worker's custom metrics
    read (the first one answers)."""

    def __init__(self, first: TaskRecord, second: TaskRecord):
        self.first, self.second = first, second

    def started(self, key, job: int, dag: int) -> None:
        self.first.started(key, job, dag)
        self.second.started(key, job, dag)

    def ended(self, key) -> tuple[int, int] | None:
        self.second.ended(key)
        return self.first.ended(key)

    def idle(self) -> bool:
        return self.first.idle()


class TaskRegistry:
    """Executing tasks with their (job, dag), fed by the worker plugin. ``brief=False``: no in-process
    sampler takes snapshots, so tasks that start and end between two are not kept for one."""

    def __init__(self, nthreads: int = 1, managed_bytes: Callable[[], int] = lambda: 0, brief: bool = True):
        self._lock = threading.Lock()
        self._track = brief
        self._running: dict = {}
        self._fresh: set = set()  # started since the last sample's snapshot
        self._brief: dict = {}  # started and finished since then: shown once, at the next sample
        self._last_job = 0
        self._busy = 0.0  # the busy-time counter (Snapshot.busy): what a simulated GPU averages
        self.nthreads = nthreads
        self._managed_bytes = managed_bytes

    def started(self, key, job: int, dag: int) -> None:
        with self._lock:
            if key not in self._running:
                self._busy -= time.monotonic()
            self._running[key] = (job, dag)
            if self._track:
                self._fresh.add(key)
            if job:
                self._last_job = job

    def idle(self) -> bool:
        """Whether no task is executing."""
        with self._lock:
            return not self._running

    def ended(self, key) -> tuple[int, int] | None:
        """Forget ``key``; returns its ``(job, dag)``, or None if it was not executing."""
        with self._lock:
            where = self._running.pop(key, None)
            if where is not None:
                self._busy += time.monotonic()
                if key in self._fresh:
                    self._brief[key] = where
        return where

    def clear(self) -> None:
        with self._lock:
            self._busy += len(self._running) * time.monotonic()
            self._running.clear()
            self._fresh.clear()
            self._brief.clear()

    def unsampled(self) -> bool:
        """Whether tasks started and finished since the last sample (no sample has seen them yet)."""
        with self._lock:
            return bool(self._brief)

    def snapshot(self, sample: bool = False) -> Snapshot:
        """What runs now. For a sample (``sample=True``), also the tasks that started and
        finished since the last sample, counted as executing at this one (so they leave a trace)."""
        with self._lock:
            running = tuple((k, j, d) for k, (j, d) in self._running.items())
            if sample:
                running += tuple((k, j, d) for k, (j, d) in self._brief.items())
                self._brief, self._fresh = {}, set()
            last, busy = self._last_job, (self._busy, len(self._running))
        try:
            managed = int(self._managed_bytes())
        except Exception:  # worker state mid-update: report nothing rather than fail
            managed = 0
        return Snapshot(running, self.nthreads, managed, last, 0.0, *busy)


class CachedSnapshot:
    """One snapshot per sample, shared by the tags and every source.

    >>> cache = CachedSnapshot(TaskRegistry()); cache.refresh(); cache().executing
    0
    """

    def __init__(self, registry: TaskRegistry):
        self._registry = registry
        self._snap = registry.snapshot()

    def refresh(self) -> None:
        self._snap = self._registry.snapshot(sample=True)

    def __call__(self) -> Snapshot:
        return self._snap
