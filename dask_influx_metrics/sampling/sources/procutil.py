"""Whose work was it: NVML's per-process SM and memory utilization on a shared GPU.

The driver keeps a short buffer of per-process samples: SM and memory-controller
percent for each process that ran a kernel, with a timestamp (us, wall clock).
A call returns the samples newer than ``lastSeenTimeStamp``; a process absent
from the answer ran nothing in that window (0 %), and NotFound means nobody did.
Timestamp 0 returns the whole buffer, including samples seconds old (the
recorded H100: the holder's 11 s old sample), so :class:`ProcessUtilization`
uses its first answer only to learn where "now" is and reports windows from the
second call on, always passing the newest timestamp seen (never 0 again).

The call is slow (~2 ms per GPU on an H100, the recording's ``timing_us``), so
it is made at most every ``interval_s`` (1 s) per device unless ``force``.

**Shares that start with the work.** The driver lists a process only once it
has taken a per-process sample of it, which can trail the kernels' start by up
to its own sampling period: an answer that lists nobody while the device read
busy since the previous answer (``busy``) does not mean "nobody ran", only
"not sampled yet". Such a window is not closed: the next answer covers it too
(at most :data:`DEFER_READS` answers in a row; a forced read, a worker's or
the session's last, always closes it), so a job whose kernels begin between
two reads gets its share of them instead of 0.
``nvmlDeviceGetProcessesUtilizationInfo`` (driver 550+) is used where the driver
has it, else ``nvmlDeviceGetProcessUtilization``; both give the same figures.

NVML gives no per-process utilization for a MIG instance: there the reader
says so once and returns None forever; it never charges the parent's figures.

:func:`worker_utilization` maps the per-process figures to workers through
their process trees (:class:`.gpuprocs.Ancestry`); PIDs are host PIDs
(see :func:`.gpuprocs.host_pid_problem`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Iterable, Mapping

from ...notices import Once

logger = logging.getLogger(__name__)

READ_INTERVAL_S = 1.0
DEFER_READS = 1  # answers listing nobody while the device was busy that may be left for the next one
_CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")  # best first


class ProcessUtilization:
    """Per-process (SM %, memory %) of one GPU over the window since the previous read.

    ``read()`` returns ``{pid: (sm_util, mem_util)}`` (a pid absent ran nothing:
    0 %), or None when there is no window to report: the first call, too soon
    after the previous read, an NVML error this time, no support, or an answer
    listing nobody while ``busy`` (the device's utilization was > 0 at some
    sample since the last window: the driver has not sampled the process yet;
    see the module docstring). ``busy`` is told at every sample (None: unknown).
    ``clock`` (monotonic seconds) paces the reads; ``wall`` (Unix seconds) gives
    "now" when the first answer is empty.
    """

    def __init__(
        self,
        nvml,
        handle,
        *,
        interval_s: float = READ_INTERVAL_S,
        label: str = "GPU",
        clock=time.monotonic,
        wall=time.time,
    ):
        self._nvml, self._handle, self._label = nvml, handle, label
        self._interval, self._clock, self._wall = interval_s, clock, wall
        self._calls = [getattr(nvml, n) for n in _CALLS if getattr(nvml, n, None) is not None]
        self._unsupported = (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NoPermission)
        self._last_seen = 0  # us; never 0 again after the first answer
        self._read_at: float | None = None
        self._busy = False  # the device read busy at a sample since the last window closed
        self._deferred = 0  # answers in a row that listed nobody while the device was busy
        self._once = Once()
        if not self._calls:
            self._say_once(
                "off", "this pynvml has no per-process utilization call; per-worker GPU utilization left out"
            )

    @property
    def supported(self) -> bool:
        return bool(self._calls)

    def read(self, force: bool = False, busy: bool | None = None) -> dict[int, tuple[float, float]] | None:
        if not self._calls:
            return None
        self._busy = self._busy or bool(busy)
        now = self._clock()
        if not force and self._read_at is not None and now - self._read_at < self._interval:
            return None
        self._read_at = now
        first = self._last_seen == 0
        try:
            samples = self._call()
        except self._nvml.NVMLError_NotFound:
            samples = []
        except self._nvml.NVMLError as e:
            self._say_once(
                "error",
                f"per-process utilization failed ({type(e).__name__}: {e}); left out of this window (reported once)",
                logging.WARNING,
            )
            return None
        if samples is None:  # no call left that this device supports
            return None
        newest = max((s.timeStamp for s in samples), default=0)
        self._last_seen = max(self._last_seen, newest) or int(self._wall() * 1e6)
        if first:  # the driver's whole buffer, stale: only where "now" is
            self._busy = False
            return None
        if not samples and self._busy and not force and self._deferred < DEFER_READS:
            self._deferred += 1  # busy, but nobody listed yet: the next answer covers this window too
            return None
        self._busy, self._deferred = False, 0
        return _mean_per_pid(samples)

    def _call(self):
        """The samples since ``_last_seen`` from the best call this device supports; None if none."""
        while self._calls:
            try:
                return self._calls[0](self._handle, self._last_seen)
            except self._unsupported as e:
                dropped = self._calls.pop(0)
                if not self._calls:
                    self._say_once(
                        "off",
                        f"no per-process utilization ({dropped.__name__}: "
                        f"{type(e).__name__}); per-worker GPU utilization left out",
                    )
        return None

    def _say_once(self, what: str, message: str, level: int = logging.INFO) -> None:
        if self._once(what):
            logger.log(level, "%s: %s", self._label, message)


def _mean_per_pid(samples) -> dict[int, tuple[float, float]]:
    """One (SM %, memory %) per pid: the mean of its samples in the window."""
    per_pid: dict[int, list] = defaultdict(list)
    for s in samples:
        per_pid[s.pid].append((s.smUtil, s.memUtil))
    return {
        pid: (sum(v[0] for v in vals) / len(vals), sum(v[1] for v in vals) / len(vals)) for pid, vals in per_pid.items()
    }


def worker_utilization(
    per_pid: Mapping[int, tuple[float, float]], trees: Mapping[str, Iterable[int]]
) -> dict[str, tuple[float, float]]:
    """Per worker: (SM %, memory %) summed over the PIDs of its process tree (absent PID: 0).

    ``trees``: worker -> its PIDs (``Ancestry.tree()``). Every worker given
    gets a figure, 0 when none of its processes ran a kernel; PIDs of no worker
    are not charged to anyone.

    >>> worker_utilization({425: (99.0, 32.0)}, {"tcp://a:1": {425, 430}, "tcp://b:2": {427}})
    {'tcp://a:1': (99.0, 32.0), 'tcp://b:2': (0.0, 0.0)}
    """
    result = {}
    for worker, pids in trees.items():
        mine = [per_pid[p] for p in set(pids) if p in per_pid]
        result[worker] = (float(sum(u[0] for u in mine)), float(sum(u[1] for u in mine)))
    return result


def share(per_pid: Mapping[int, tuple[float, float]], pids: Iterable[int]) -> float:
    """Percent of the GPU's kernel time (every process's smUtil, summed) that was ``pids``'; 0 when no
    process ran a kernel. The shares of the workers of one GPU add up to at most 100.

    >>> share({425: (60.0, 30.0), 427: (20.0, 5.0), 9: (20.0, 0.0)}, {425}), share({}, {425})
    (60.0, 0.0)
    """
    total = sum(sm for sm, _ in per_pid.values())
    mine = sum(per_pid[p][0] for p in set(pids) if p in per_pid)
    return 100.0 * mine / total if total > 0 else 0.0
