"""GPU memory held by one worker's process tree, from NVML's compute-process list.

``nvmlDeviceGetComputeRunningProcesses`` lists, per device, each process with a
CUDA context and the memory it holds (its allocations plus ~0.5 GiB of context);
~32 us per call on an H100. The worker's share is the sum over the worker
process and its descendants (tasks may start child processes), which are
refreshed every :data:`TREE_REFRESH_S` seconds.

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
TREE_REFRESH_S = 5.0
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


class ProcessTree:
    """The worker process and its descendants, refreshed at most every ``refresh`` seconds."""

    def __init__(self, pid: int | None = None, refresh: float = TREE_REFRESH_S, clock=time.monotonic):
        self.pid, self._refresh, self._clock = pid or os.getpid(), refresh, clock
        self._pids: frozenset = frozenset({self.pid})
        self._at = None

    def pids(self) -> frozenset:
        now = self._clock()
        if self._at is None or now - self._at >= self._refresh:
            self._at = now
            try:
                import psutil

                self._pids = frozenset({self.pid} | {c.pid for c in psutil.Process(self.pid).children(recursive=True)})
            except Exception:  # the process table changed under us: keep the last known tree
                pass
        return self._pids
