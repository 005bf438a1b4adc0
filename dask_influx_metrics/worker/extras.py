"""What only the worker process can sample: custom metrics and the task stream (they need the worker).

:class:`WorkerExtras` is a sampler's ``collect``: custom metrics tagged with the
worker's own jobs (per device with the device tags), then the task and activity
points of the executions that ended since the last call. Beside the agent it
runs on a thread of its own into the worker's outbox (:func:`schedule`): the
task stream every :data:`TASKS_EVERY_S` (more often only to follow a shorter
polling interval's custom metrics), in one write for all the tasks that ended meanwhile, so a killed
worker loses at most the points of its last quarter second (a task point
carries its own time, an activity point covers the time since the last);
custom metrics once per polling interval. With ``sampler.mode: thread`` it
joins the in-process sample.
"""

from __future__ import annotations

import math
from typing import Callable

from .. import lineprotocol
from ..schema import CUSTOM, Point

TASKS_EVERY_S = 0.2  # a finished task's points wait in the worker at most this (+ scheduling): < 250 ms (issue 43)


class WorkerExtras:
    """``collect(now_ns)``: custom metrics and task-stream points (see the module docstring); ``lines(now_ns)``:
    the same, written (beside the agent).

    ``custom``: a :class:`.custom.CustomSource`, or None; ``tasks``: the
    :class:`.taskstream.TaskStream`, or None; ``tags``: the worker's own
    (without job/dag, from ``snapshot()``); ``offset()``: seconds to add to this host's time;
    ``field_tags``: the tags :meth:`lines` writes as fields (settings.field_tags).
    """

    def __init__(
        self,
        custom,
        tasks,
        tags: dict,
        snapshot,
        offset: Callable[[], float],
        custom_every: int = 1,
        field_tags: tuple = (),
    ):
        self._custom, self.tasks = custom, tasks
        self._tags, self._snapshot, self._offset = tags, snapshot, offset
        self.custom_every, self._calls = custom_every, 0  # custom metrics on every custom_every-th collect
        self._field_tags = tuple(field_tags)

    def collect(self, now_ns: int) -> list[Point]:
        now_ns += int(self._offset() * 1e9)
        points = self._custom_points(now_ns)
        if self.tasks is not None:
            points += self.tasks.points(now_ns)
        return points

    def lines(self, now_ns: int) -> list[bytes]:
        """:meth:`collect`'s points as line protocol, the field tags moved: what the link's thread writes into
        the outbox (the task stream writes its lines itself: :meth:`.taskstream.TaskStream.lines`)."""
        now_ns += int(self._offset() * 1e9)
        points = self._custom_points(now_ns)
        if self._field_tags:
            points = [lineprotocol.tags_as_fields(p, self._field_tags) for p in points]
        lines = lineprotocol.encode_many(points) if points else []
        return lines + self.tasks.lines(now_ns) if self.tasks is not None else lines

    def _custom_points(self, now_ns: int) -> list[Point]:
        self._calls += 1
        if self._custom is None or (self._calls - 1) % self.custom_every:
            return []
        snap = self._snapshot()
        tags = {**self._tags, "job": snap.job_tag, "dag": snap.dag_tag}
        return [Point(CUSTOM, {**tags, **r.tags}, r.fields, now_ns) for r in self._custom.read()]

    def pending(self) -> bool:
        """Whether finished tasks wait for their points (beside the agent, its link's thread wakes only then)."""
        return self.tasks is not None and self.tasks.pending()

    def stop(self) -> None:
        if self._custom is not None:
            self._custom.stop()


def schedule(settings, tasks: bool, custom: bool) -> tuple[float, int]:
    """Seconds between two collects beside the agent, and on every how many of them custom metrics are read:
    with the task stream, the polling interval cut into equal parts of at most :data:`TASKS_EVERY_S`; under
    it, every :data:`TASKS_EVERY_S` when no custom metric is read each interval (a wake of the link's thread
    costs the worker ~0.1 ms of CPU: at 50 ms, 20 a second while tasks run).

    >>> from dask_influx_metrics.config import Settings
    >>> schedule(Settings.resolve({"polling-interval": 2000}), tasks=True, custom=True)
    (0.2, 10)
    >>> schedule(Settings.resolve({"polling-interval": 300}), True, False), schedule(Settings.resolve(), True, False)
    ((0.15, 2), (0.2, 1))
    >>> schedule(Settings.resolve({"polling-interval": 50}), True, False), schedule(Settings.resolve({"polling-interval": 50}), True, True)
    ((0.2, 1), (0.05, 1))
    >>> schedule(Settings.resolve({"polling-interval": 50}), tasks=False, custom=True)
    (0.05, 1)
    """
    every = settings.polling_interval / 1000.0
    if tasks and not custom and every < TASKS_EVERY_S:
        return TASKS_EVERY_S, 1
    parts = max(1, math.ceil(every / TASKS_EVERY_S - 1e-9)) if tasks else 1
    return every / parts, parts
