"""What only the worker process can sample: custom metrics and the task stream (they need the worker).

:class:`WorkerExtras` is a sampler's ``collect``: custom metrics tagged with the
worker's own jobs (per device with the device tags), then the task and activity
points of the executions that ended since the last call. Beside the agent it
runs on a thread of its own with one sink, every polling interval when there
are custom metrics, else once a second (a task point carries its own time, an
activity point covers the time since the last); with ``sampler.mode: thread``
it joins the in-process sample.
"""

from __future__ import annotations

from typing import Callable

from ..schema import CUSTOM, Point

TASKS_ONLY_S = 1.0  # seconds between collects when only the task stream is wanted


class WorkerExtras:
    """``collect(now_ns)``: custom metrics and task-stream points (see the module docstring).

    ``custom``: a :class:`.custom.CustomSource`, or None; ``tasks``: the
    :class:`.taskstream.TaskStream`, or None; ``tags``: the worker's own
    (without job/dag, from ``snapshot()``); ``offset()``: seconds to add to this host's time.
    """

    def __init__(self, custom, tasks, tags: dict, snapshot, offset: Callable[[], float]):
        self._custom, self.tasks = custom, tasks
        self._tags, self._snapshot, self._offset = tags, snapshot, offset

    def collect(self, now_ns: int) -> list[Point]:
        now_ns += int(self._offset() * 1e9)
        points = []
        if self._custom is not None:
            snap = self._snapshot()
            tags = {**self._tags, "job": snap.job_tag, "dag": snap.dag_tag}
            points = [Point(CUSTOM, {**tags, **r.tags}, r.fields, now_ns) for r in self._custom.read()]
        if self.tasks is not None:
            points += self.tasks.points(now_ns)
        return points

    def pending(self) -> bool:
        """Whether finished tasks wait for their points (then a last collect is due at stop)."""
        return self.tasks is not None and self.tasks.pending()

    def stop(self) -> None:
        if self._custom is not None:
            self._custom.stop()


def interval(settings, custom: list) -> float:
    """Seconds between two collects beside the agent."""
    every = settings.polling_interval / 1000.0
    return every if custom else max(every, TASKS_ONLY_S)
