"""Space in use on the filesystems the host's workers write to: one ``disk`` reading per filesystem.

The paths are each worker's Dask ``local_directory`` (its spill folder, ``storage/``, is
inside it) and the session's run folder; the agent learns a worker's from its
registration (``workers/<id>.json``). Each filesystem is read once however many
paths lie on it (one ``os.statvfs`` per filesystem), tagged ``path`` with its mount
point: the nearest folder above the path that is one (``os.path.ismount``), found once
per path. The figures are ``psutil.disk_usage``'s (and ``df``'s, and Telegraf's disk
input's): ``total`` = blocks x fragment size, ``used`` = total - free, ``used_percent``
= used / (used + available to unprivileged users) x 100, rounded to 0.1.

With ``refresh`` (seconds) the filesystems are read at most that often, as the host
counters (:mod:`.host`); the reads in between repeat the last. A path that cannot be
read (removed, no permission) is left out and said once.

Example
-------
>>> [r.tags["path"] for r in DiskUsage(frozenset({("disk", "used_percent")})).read(["/", "/"])]
['/']
"""

from __future__ import annotations

import logging
import os
import time

from ...reports import Once
from ...schema import DISK, FIELDS, Reading

logger = logging.getLogger(__name__)


def mount_point(path: str) -> str:
    """The mount point of the filesystem holding ``path`` (symlinks resolved).

    >>> mount_point("/proc/self")
    '/proc'
    """
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def usage(path: str) -> dict:
    """``used_percent``, ``used`` and ``total`` of the filesystem holding ``path``, as ``psutil.disk_usage``."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    used = total - st.f_bfree * st.f_frsize
    room = used + st.f_bavail * st.f_frsize
    return {"used_percent": round(100.0 * used / room, 1) if room else 0.0, "used": used, "total": total}


class DiskUsage:
    """``disk`` readings of the filesystems holding the paths given to :meth:`read` (see the module docstring)."""

    def __init__(self, fields: frozenset, refresh: float = 0.0):
        self._names = tuple(n for m, n in FIELDS if m == DISK and (m, n) in fields)
        self._refresh = refresh
        self._due = 0.0  # monotonic time of the next read
        self._paths: tuple = ()  # the paths of the last read
        self._last: list[Reading] = []
        self._where: dict[str, tuple | None] = {}  # path -> (st_dev, mount point), None: unreadable
        self._once = Once()

    def _locate(self, path: str):
        if path not in self._where:
            try:
                self._where[path] = (os.stat(path).st_dev, mount_point(path))
            except OSError as e:
                self._where[path] = None
                self._report(path, e)
        return self._where[path]

    def _report(self, path: str, e: Exception) -> None:
        if self._once(path):
            logger.warning("disk usage of %s unavailable (%s: %s); left out (reported once)", path, type(e).__name__, e)

    def read(self, paths) -> list[Reading]:
        """One reading per filesystem holding ``paths`` (None and repeats are skipped); the last readings
        again until ``refresh`` s have passed, unless the paths changed."""
        paths = tuple(dict.fromkeys(p for p in paths if p))
        now = time.monotonic()
        if now < self._due and paths == self._paths:
            return self._last
        self._due, self._paths = now + self._refresh, paths
        seen, out = set(), []
        for path in paths:
            where = self._locate(path)
            if where is None or where[0] in seen:
                continue
            seen.add(where[0])
            try:
                values = usage(path)
            except OSError as e:
                self._report(path, e)
                continue
            out.append(Reading(DISK, {"path": where[1]}, {n: values[n] for n in self._names}))
        self._last = out
        return out
