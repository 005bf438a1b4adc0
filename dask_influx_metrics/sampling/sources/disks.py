"""Space in use on the filesystems the host's workers write to: one ``disk`` reading per filesystem.

The paths are each worker's Dask ``local_directory`` (its spill folder, ``storage/``, is
inside it) and the session's run folder; the agent learns a worker's from its
registration (``workers/<id>.json``). Each filesystem is read once however many
paths lie on it (one ``os.statvfs`` per filesystem), tagged ``path`` with its mount
point: the nearest folder above the path that is one (``os.path.ismount``), found once
per path. The figures are ``psutil.disk_usage``'s (and ``df``'s, and Telegraf's disk
input's): ``total`` = blocks x fragment size, ``used`` = total - free, ``used_percent``
= used / (used + available to unprivileged users) x 100, rounded to 0.1.

With ``refresh`` (seconds) :meth:`DiskUsage.due` says when the next read is due; the
collector reads (and writes ``disk`` points) only then. The agent reads them once a
second (:data:`REFRESH_S`, the reference ``perf.py``'s rate), or at the host refresh rate
when that is slower: space in use moves slowly, and a ``statvfs`` costs 20-35 us of CPU
when the agent wakes (measured on the 2-core test VM), more than all the other new host
readings together. A path that cannot be read (removed, no permission) is left out and
said once.

Example
-------
>>> [r.tags["path"] for r in DiskUsage(frozenset({("disk", "used_percent")})).read(["/", "/"])]
['/']
"""

from __future__ import annotations

import logging
import os
import time

from ...notices import Once
from ...schema import DISK, FIELDS, Reading

logger = logging.getLogger(__name__)
REFRESH_S = 1.0  # the filesystems are read at most once a second (the host refresh rate when slower)


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
    return _figures(os.statvfs(path))


def _figures(st) -> dict:
    total = st.f_blocks * st.f_frsize
    used = total - st.f_bfree * st.f_frsize
    room = used + st.f_bavail * st.f_frsize
    return {"used_percent": round(100.0 * used / room, 1) if room else 0.0, "used": used, "total": total}


class DiskUsage:
    """``disk`` readings of the filesystems holding the paths given to :meth:`read` (see the module docstring)."""

    def __init__(self, fields: frozenset, refresh: float = 0.0):
        self._names = tuple(n for m, n in FIELDS if m == DISK and (m, n) in fields)
        self._every = len(self._names) == 3
        self._refresh = refresh
        self._due = 0.0  # monotonic time of the next read
        self._paths: tuple = ()  # the paths of the last read
        self._targets: list = []  # (a path, its reading's tags) per filesystem of those paths
        self._once = Once()

    def _resolve(self, paths: tuple) -> list:
        """One (path, tags) per filesystem of ``paths`` (None and repeats skipped); unreadable paths said once."""
        seen, out = set(), []
        for path in dict.fromkeys(p for p in paths if p):
            try:
                device, mount = os.stat(path).st_dev, mount_point(path)
            except OSError as e:
                self._report(path, e)
                continue
            if device not in seen:
                seen.add(device)
                out.append((path, {"path": mount}))
        return out

    def _report(self, path: str, e: Exception) -> None:
        if self._once(path):
            logger.warning("disk usage of %s unavailable (%s: %s); left out (reported once)", path, type(e).__name__, e)

    def due(self) -> bool:
        """Whether ``refresh`` s have passed since the last :meth:`read` (the collector reads only then)."""
        return time.monotonic() >= self._due

    def read(self, paths) -> list[Reading]:
        """One reading per filesystem holding ``paths``, now (the paths' filesystems found when they change)."""
        paths = tuple(paths)
        if paths != self._paths:
            self._paths, self._targets = paths, self._resolve(paths)
        self._due = time.monotonic() + self._refresh
        out = []
        for path, tags in self._targets:
            try:
                figures = _figures(os.statvfs(path))
            except OSError as e:
                self._report(path, e)
                continue
            out.append(Reading(DISK, tags, figures if self._every else {n: figures[n] for n in self._names}))
        return out
