"""The workers the agent serves, found in the run folder: one :class:`~..sampling.view.WorkerView` each.

A worker registers in the session's host folder (:mod:`..link.runfolder`):
``workers/<id>.json`` (address, pid, tags, ``CUDA_VISIBLE_DEVICES``), its task
snapshot ``workers/<id>.snap`` and its outbox (:mod:`..link.outbox`: the points only
it makes, for the agent to send). :class:`FolderWorkers` looks at the folder
once a second or when a worker woke the agent (it arrives and leaves with a
wake), and checks once a second that each
worker's process still lives; a worker whose ``.json`` is gone is leaving (it
waits until the agent has sampled it, sent its outbox and flushed, then the
agent removes its files); one whose process died is forgotten, its outbox sent
first.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from ..link import outbox, runfolder
from ..link.outbox import OutboxReader
from ..link.seqlock import SnapshotBuffer
from ..link.snapshot import BUFFER_BYTES, SnapshotReader
from ..sampling.view import WorkerView

logger = logging.getLogger(__name__)
LIVENESS_S = 1.0  # how often the workers' processes are checked


class FolderWorkers:
    """The workers registered in ``folder``; ``make(id, info, snapshot) -> WorkerView``; ``spill``: this session's
    folder on disk for the outboxes the run folder has no room for (where a dead session's go too)."""

    def __init__(self, folder: str, make: Callable[..., WorkerView], spill: str | None = None):
        self.folder, self._make, self.spill = folder, make, spill
        self.foreign: dict[str, str] = {}  # worker id -> why this agent cannot sample it (another PID namespace)
        self._dir = os.path.join(folder, runfolder.WORKERS)
        self.views: dict[str, WorkerView] = {}
        self.outboxes: dict[str, OutboxReader] = {}  # worker id -> its outbox: the live, the leaving, the dead
        self._gone: list[str] = []  # dead workers whose outbox goes out with the next sends, then is removed
        self._behind: set[str] = set()  # outboxes said to hold a backlog
        self._given: list[tuple[OutboxReader, int]] = []  # what the last outgoing() moved: (outbox, lines)
        self._checked = 0.0

    def refresh(self, changed: bool = False) -> list[WorkerView]:
        """The workers leaving since the last call (their ``.json`` removed); :attr:`views` the rest.
        The folder is looked at once a second, or now when ``changed`` (a worker woke the agent: it
        arrives, or leaves, or a task started on it)."""
        now = time.monotonic()
        if not changed and now - self._checked < LIVENESS_S:
            return []
        # listed whenever woken: the folder's mtime cannot tell (two workers leaving within one tick of the
        # kernel's coarse file clock left the same mtime, and the second waited a second for its last sample)
        left = []
        if now - self._checked >= LIVENESS_S:
            self._checked = now
            for wid, view in list(self.views.items()):
                if not runfolder.alive(view.pid):  # killed: nothing to wait for but its outbox
                    self._remove(wid)
                    logger.info("worker %s (pid %d) is gone", view.address, view.pid)
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            names = []
        files = {n[:-5]: os.path.join(self._dir, n) for n in names if n.endswith(".json")}
        self._adopt(names)
        for wid in set(self.views) - set(files):
            left.append(self.views.pop(wid))
            self.outboxes[wid].trust = False  # its last writes: looked at whatever it counted
        for wid in sorted(set(files) - set(self.views) - set(self.foreign)):
            view = self._open(wid, files[wid])
            if view is not None:
                self.views[wid] = view
        return left

    def live(self) -> list[WorkerView]:
        """The workers in the order they arrived: the first of them owns the host's and its GPUs'
        points (the owner changes only when it leaves)."""
        return list(self.views.values())

    def _open(self, wid: str, path: str) -> WorkerView | None:
        info = runfolder.read_worker(path)
        if not info:
            return None
        if info.get("started") is not None and runfolder.started(info["pid"]) != info["started"]:
            if runfolder.dead(self.folder, wid):  # killed while no agent ran (its life lock is free)
                self.outboxes[wid] = OutboxReader(self._dir, wid, info.get("spill"))
                self._unlink(wid)
                self._gone.append(wid)
                logger.info(
                    "worker %s (pid %d) died while no agent ran: its outbox is sent", info["address"], info["pid"]
                )
                return None
            # its pid names another process (or none) here: never read that one's numbers as the worker's
            self.foreign[wid] = (
                f"the host's sampling agent (pid {os.getpid()}) cannot see worker {info['address']} "
                f"as pid {info['pid']}: they run in different PID namespaces (containers sharing "
                "/dev/shm but not the PID namespace)"
            )
            return None
        try:
            buffer = SnapshotBuffer.open(os.path.join(self._dir, f"{wid}.snap"), BUFFER_BYTES)
        except (OSError, ValueError):  # not there yet: next time
            return None
        self.outboxes[wid] = OutboxReader(self._dir, wid, info.get("spill"))
        return self._make(wid, info, SnapshotReader(buffer))

    def _remove(self, wid: str) -> None:
        """A dead worker: its files go now, its outbox once sent (:meth:`sent`), whatever it counted (it may have
        died between a write and its count)."""
        view = self.views.pop(wid, None)
        if view is not None:
            view.close()
        self.outboxes[wid].trust = False
        self._unlink(wid)
        self._gone.append(wid)

    def _adopt(self, names: list[str]) -> None:
        """The outboxes a dead session's workers left (moved here by :func:`..link.runfolder.remove_stale`): sent
        like a dead worker's, then removed. ``names``: the folder's listing."""
        for wid in outbox.ids_of(n for n in names if n.startswith(outbox.STALE)):
            if wid not in self.outboxes:
                self.outboxes[wid] = OutboxReader(self._dir, wid, self.spill)
                self._gone.append(wid)
                logger.info("sending what a worker of a session whose processes are gone left unsent (%s)", wid)

    def outgoing(self) -> list[bytes]:
        """What every outbox holds that was not sent yet (live, leaving and dead workers'), a bounded part of
        each (:data:`..link.outbox.TAKE_BYTES`): a backlog goes out over the next samples."""
        lines, self._given = [], []
        for wid, box in self.outboxes.items():
            taken = box.take()
            lines += taken
            if not box.unchanged:  # (an idle worker's: nothing to note)
                self._given.append((box, len(taken)))
            if box.behind and wid not in self._behind:
                self._behind.add(wid)
                logger.info("worker %s's outbox holds a backlog: sent over the next samples", wid)
        return lines

    @property
    def behind(self) -> bool:
        """Whether an outbox held more than :meth:`outgoing` gave (or its sink took)."""
        return any(box.behind for box in self.outboxes.values())

    def sent(self, count: int | None = None) -> None:
        """The first ``count`` lines :meth:`outgoing` gave (default: all) are in the sink: noted (the rest is
        given again next time); the drained outboxes of dead workers removed."""
        for box, n in self._given:
            box.sent(None if count is None else min(n, count))
            count = None if count is None else max(0, count - n)
        self._given = []
        for wid in [w for w in self._gone if not self.outboxes[w].behind]:
            self._gone.remove(wid)
            self.outboxes.pop(wid).remove()

    def forget(self, wid: str) -> None:
        """Remove worker ``wid``'s files, its outbox once sent (its snapshot last: the worker waits for that)."""
        box = self.outboxes.get(wid)
        if box is not None and box.behind:
            self._gone.append(wid)  # the rest of its backlog first
        elif box is not None:
            self.outboxes.pop(wid).remove()
        self._unlink(wid)

    def _unlink(self, wid: str) -> None:
        for name in (f"{wid}.json", f"{wid}.snap", runfolder.life_lock(wid)):
            try:
                os.unlink(os.path.join(self._dir, name))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        for view in self.views.values():
            view.close()
        self.views = {}
