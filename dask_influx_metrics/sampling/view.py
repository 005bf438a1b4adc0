"""One worker as a sampler sees it: its tags, its GPUs, its published tasks and its process.

The agent keeps one per registered worker (:mod:`...agent.workers`); a worker sampling itself
(``sampler.mode: thread``) keeps one of itself.
"""

from __future__ import annotations

from typing import Callable

from ..clock import SteadyOffset
from ..schema import WORKER
from .sources.host import HostSource
from .sources.tasks import TaskSource


class WorkerView:
    """One worker: ``snapshot`` (``refresh()`` per sample, then ``snapshot()``), its tags, its
    ``local_directory`` and ``worker`` fields. ``offset()``: seconds to add to this host's time (default: the worker's
    published clock-offset estimate, steadied)."""

    def __init__(
        self, worker_id: str, info: dict, snapshot, fields: frozenset, offset: Callable[[], float] | None = None
    ):
        self.id, self.info = worker_id, info
        self.address, self.pid, self.visible = info["address"], int(info["pid"]), info.get("visible")
        self.local_directory = info.get("local_directory")  # where it spills: its filesystem's usage is read
        self.tags = dict(info["tags"])
        self.snapshot = snapshot
        self.offset = offset or SteadyOffset(lambda: snapshot().scheduler_delay)
        self.uuids: list[str] = []
        self._process = HostSource(frozenset(f for f in fields if f[0] == WORKER), pid=self.pid)
        self._tasks = TaskSource(fields, snapshot)

    def read(self, snap=None) -> dict:
        """This worker's ``worker`` fields now: its process's CPU and RSS, its tasks (those of ``snap``, its
        snapshot of this sample; default: ``snapshot()``)."""
        return {**self._process.read_process(), **self._tasks.read(snap)}

    def close(self) -> None:
        self._process.close()
        close = getattr(self.snapshot, "close", None)
        if close is not None:
            close()
