"""The ``worker`` measurement's task fields (``tasks``, ``running``, ``managed_bytes``) from a snapshot.

Example
-------
>>> from dask_influx_metrics.link.snapshot import Snapshot
>>> src = TaskSource(frozenset({("worker", "tasks")}), lambda: Snapshot(((("x", 0), 1, 3),), 2, 0, 1))
>>> src.read()
{'tasks': 1}
"""

from __future__ import annotations

import json
from typing import Callable

from ...link.snapshot import Snapshot, plain_key
from ...schema import WORKER


def key_json(keys) -> str:
    """Task keys as a JSON list; tuple keys become lists, any string survives.

    >>> key_json([("a, b", 1), 'say "hi"'])
    '[["a, b", 1], "say \\\\"hi\\\\""]'
    """
    return json.dumps([plain_key(k) for k in keys], ensure_ascii=False)


class TaskSource:
    """The ``worker`` measurement's task fields, from its snapshot (what the worker runs).

    The ``running`` JSON is made again only when the executing keys change."""

    def __init__(self, fields: frozenset, snapshot: Callable[[], Snapshot]):
        self._want = {name for m, name in fields if m == WORKER} & {"tasks", "running", "managed_bytes"}
        self._snapshot = snapshot
        self._running: tuple = (None, "")  # (keys, their JSON) of the last read
        self._read: tuple = (None, {})  # (the snapshot, its fields) of the last read: callers copy them

    def read(self, snap: Snapshot | None = None) -> dict:
        """The fields of ``snap`` (default: the snapshot now; a sampler that holds it already passes it)."""
        if not self._want:
            return {}
        if snap is None:
            snap = self._snapshot()
        if snap is self._read[0]:  # the same snapshot (a worker idle, or no change): the same fields
            return self._read[1]
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
        self._read = (snap, values)
        return values
