"""What the worker is doing: executing tasks, their job/DAG, bytes held.

The worker plugin feeds :class:`TaskRegistry` from ``WorkerPlugin.transition``
(on the event loop); the sampler thread reads consistent snapshots under a
lock, so it never touches the worker's own state machine.

Example
-------
>>> reg = TaskRegistry(nthreads=2)
>>> reg.started(("x", 0), job=1, dag=3)
>>> snap = reg.snapshot()
>>> snap.executing, snap.job_tag, snap.dag_tag
(1, '1', '3')
>>> reg.finished(("x", 0))
(1, 3)
>>> reg.snapshot().dag_tag
'0'
"""

from __future__ import annotations

import json
import threading
from typing import Callable, NamedTuple

from ... import jobtags
from ...schema import WORKER, Reading


class Activity(NamedTuple):
    """A consistent snapshot of the worker at one instant."""

    running: tuple  # ((key, job, dag), ...) in start order
    nthreads: int
    managed_bytes: int
    last_job: int
    scheduler_delay: float = 0.0  # the worker's clock offset (as a sidecar reads it; in-process unused)

    @property
    def executing(self) -> int:
        return len(self.running)

    @property
    def job_tag(self) -> str:
        """Jobs of executing tasks ('1,2'), else the last job run here.

        Tasks submitted while no session ran carry job 0 and are left out."""
        return jobtags.format((job for _, job, _ in self.running), idle=self.last_job)

    @property
    def dag_tag(self) -> str:
        """DAGs of executing tasks ('3,5'); '0' when idle."""
        return jobtags.format(dag for _, _, dag in self.running)


class TaskRegistry:
    """Executing tasks with their (job, dag), fed by the worker plugin."""

    def __init__(self, nthreads: int = 1, managed_bytes: Callable[[], int] = lambda: 0):
        self._lock = threading.Lock()
        self._running: dict = {}
        self._fresh: set = set()  # started since the last sample's snapshot
        self._brief: dict = {}  # started and finished since then: shown once, at the next sample
        self._last_job = 0
        self.nthreads = nthreads
        self._managed_bytes = managed_bytes

    def started(self, key, job: int, dag: int) -> None:
        with self._lock:
            self._running[key] = (job, dag)
            self._fresh.add(key)
            if job:
                self._last_job = job

    def idle(self) -> bool:
        """Whether no task is executing."""
        with self._lock:
            return not self._running

    def finished(self, key):
        """Forget ``key``; returns its ``(job, dag)``, or None if it was not executing."""
        with self._lock:
            where = self._running.pop(key, None)
            if where is not None and key in self._fresh:
                self._brief[key] = where
        return where

    def clear(self) -> None:
        with self._lock:
            self._running.clear()
            self._fresh.clear()
            self._brief.clear()

    def unsampled(self) -> bool:
        """Whether tasks started and finished since the last sample (no sample has seen them yet)."""
        with self._lock:
            return bool(self._brief)

    def snapshot(self, sample: bool = False) -> Activity:
        """What runs now. For a sample (``sample=True``), also the tasks that started and
        finished since the last sample, counted as executing at this one (so they leave a trace)."""
        with self._lock:
            running = tuple((k, j, d) for k, (j, d) in self._running.items())
            if sample:
                running += tuple((k, j, d) for k, (j, d) in self._brief.items())
                self._brief, self._fresh = {}, set()
            last = self._last_job
        try:
            managed = int(self._managed_bytes())
        except Exception:  # worker state mid-update: report nothing rather than fail
            managed = 0
        return Activity(running, self.nthreads, managed, last)


class CachedActivity:
    """One snapshot per sample, shared by the tags and every source.

    >>> cache = CachedActivity(TaskRegistry()); cache.refresh(); cache().executing
    0
    """

    def __init__(self, registry: TaskRegistry):
        self._registry = registry
        self._snap = registry.snapshot()

    def refresh(self) -> None:
        self._snap = self._registry.snapshot(sample=True)

    def __call__(self) -> Activity:
        return self._snap


def plain_key(k):
    """A task key as JSON-ready data: tuples become lists, numbers stay, anything else is ``str``.

    >>> plain_key(("x", 1, b"y"))
    ['x', 1, "b'y'"]
    """
    return [plain_key(p) for p in k] if isinstance(k, tuple) else (k if isinstance(k, (int, float)) else str(k))


def key_json(keys) -> str:
    """Task keys as a JSON list; tuple keys become lists, any string survives.

    >>> key_json([("a, b", 1), 'say "hi"'])
    '[["a, b", 1], "say \\\\"hi\\\\""]'
    """
    return json.dumps([plain_key(k) for k in keys], ensure_ascii=False)


class TaskSource:
    """The ``worker`` measurement's task fields, from an activity snapshot.

    The ``running`` JSON is made again only when the executing keys change."""

    def __init__(self, fields: frozenset, activity: Callable[[], Activity]):
        self._want = {name for m, name in fields if m == WORKER} & {"tasks", "running", "managed_bytes"}
        self._activity = activity
        self._running: tuple = (None, "")  # (keys, their JSON) of the last read

    def read(self) -> list[Reading]:
        if not self._want:
            return []
        snap = self._activity()
        values = {}
        if "tasks" in self._want:
            values["tasks"] = snap.executing
        if "running" in self._want:
            keys = tuple(k for k, _, _ in snap.running if k is not None)  # None: a key a full buffer left out
            if keys != self._running[0]:
                self._running = (keys, key_json(keys))
            values["running"] = self._running[1]
        if "managed_bytes" in self._want:
            values["managed_bytes"] = snap.managed_bytes
        return [Reading(WORKER, {}, values)]
