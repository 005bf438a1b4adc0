"""GPU memory held by one worker's process tree, from NVML's compute-process list.

``nvmlDeviceGetComputeRunningProcesses`` lists, per device, each process with a
CUDA context and the memory it holds (its allocations plus ~0.5 GiB of context);
10-27 us of CPU per call on an H200. The worker's share is the sum over the worker
process and its descendants (tasks may start child processes).

Which listed process descends from which worker is learnt by following the few
PIDs NVML lists up their ``/proc/<pid>/stat`` parents (:class:`Ancestry`), each
read again at most every :data:`REFRESH_S` (1 s), and at once for a PID not seen
before. A scan of every process on the machine (psutil's ``children()`` reads
every ``/proc/<pid>/stat``: 1.5-2 ms with ~180 processes on the H200 host) is
never made.

NVML reports **host** PIDs. A worker in its own PID namespace (a container
without ``hostPID``/``--pid=host``) cannot know its host PID for certain, so the
field is left out there and that is reported once: never a wrong number. A
process listed without a memory figure (``usedGpuMemory`` unavailable) makes
the worker's figure unknown too.

Example
-------
>>> class P:
...     def __init__(self, pid, used): self.pid, self.usedGpuMemory = pid, used
>>> tree_memory_mib([P(10, 2**30), P(11, 2**29), P(99, 2**32)], {10, 11})
1536.0
>>> tree_memory_mib([P(99, 2**32)], {10}), tree_memory_mib([P(10, None)], {10}) is None
(0.0, True)
"""

from __future__ import annotations

import os
import time

INIT_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's fixed inode of the initial PID namespace
REFRESH_S = 1.0
_MIB = float(2**20)


def host_pid_problem(ns_link: str | None = None) -> str | None:
    """Why this process's PIDs may not be NVML's (host) PIDs, or None when they are."""
    try:
        link = ns_link if ns_link is not None else os.readlink("/proc/self/ns/pid")
    except OSError as e:
        return f"cannot read this process's PID namespace ({e})"
    if link == INIT_PID_NAMESPACE:
        return None
    return (
        f"the worker runs in its own PID namespace ({link}; a container), and NVML lists host PIDs; "
        "run the worker with the host's PID namespace (Kubernetes hostPID, docker --pid=host) "
        "to get per-worker GPU memory"
    )


def tree_memory_mib(processes, pids) -> float | None:
    """MiB held on one device by the processes in ``pids``; None if NVML gave no figure for one."""
    total = 0
    for p in processes:
        if p.pid in pids:
            if p.usedGpuMemory is None:
                return None
            total += p.usedGpuMemory
    return total / _MIB


class Ancestry:
    """The parents of the processes NVML lists, from ``/proc/<pid>/stat``, each kept at most ``refresh`` s.

    >>> a = Ancestry()
    >>> a.tree(os.getppid(), [os.getpid(), 1]) == {os.getppid(), os.getpid()}
    True
    """

    def __init__(self, refresh: float = REFRESH_S, clock=time.monotonic, proc: str = "/proc"):
        self._refresh, self._clock, self._proc = refresh, clock, proc
        self._parents: dict[int, tuple[int, float]] = {}  # pid -> (its parent, when read); 0: gone or unknown

    def tree(self, root: int, listed) -> frozenset:
        """``root`` and those of the ``listed`` PIDs that descend from it."""
        if not listed:  # no process on the GPU (every sample of an idle one)
            return frozenset((root,))
        return frozenset({root, *(pid for pid in listed if pid != root and self.descends(pid, root))})

    def descends(self, pid: int, root: int) -> bool:
        now, seen = self._clock(), 0
        while pid > 1 and seen < 64:  # a loop in a torn read ends here
            pid, seen = self._parent(pid, now), seen + 1
            if pid == root:
                return True
        return False

    def _parent(self, pid: int, now: float) -> int:
        known = self._parents.get(pid)
        if known is None or now - known[1] >= self._refresh:
            known = self._parents[pid] = (_ppid(f"{self._proc}/{pid}/stat"), now)
            if len(self._parents) > 4096:  # PIDs come and go: forget the oldest readings
                for old in sorted(self._parents, key=lambda p: self._parents[p][1])[:2048]:
                    del self._parents[old]
        return known[0]


def _ppid(path: str) -> int:
    """The parent PID in a ``/proc/<pid>/stat`` (0 when the process is gone or unreadable)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        return int(data[data.rfind(b")") + 2 :].split(None, 2)[1])  # after "pid (comm) state "
    except (OSError, ValueError, IndexError):
        return 0
