"""The clock offset that timestamps use: Dask's estimate, steadied.

Every timestamp we write is on the scheduler's clock: this host's time plus
``Worker.scheduler_delay`` (scheduler minus worker), which Dask estimates at
each heartbeat from one round trip, with an error of up to half of it. While
tasks hold the worker's GIL the heartbeat's reply waits for the event loop, and
successive estimates jump: with two GIL-holding task threads they stepped by up
to 47 ms from one heartbeat to the next here (idle: 0). Added raw, every jump
moves all later samples at once, so a 200 ms interval reads 247 or 153 ms, on
two workers of one machine whose clocks are in fact the same.

:class:`SteadyOffset` gives the sampler instead:

* the median of the last :data:`WINDOW` estimates, read at most once a second
  (one estimate per heartbeat; a spike moves the median little or not at all);
* approached at most :data:`SLEW` seconds per second (1 %): consecutive
  timestamps move by at most 1 % of their spacing;
* a step straight to it when it is more than :data:`STEP` s away: the first
  reading, or a real change such as the host's clock being stepped.

Example
-------
>>> estimates = iter([0.010, 0.010, 0.055, 0.010])
>>> now = [0.0]
>>> offset = SteadyOffset(lambda: next(estimates), clock=lambda: now[0])
>>> offset()                      # the first estimate, as is
0.01
>>> now[0] = 1.0; offset()
0.01
>>> now[0] = 2.0; offset()        # a 45 ms spike: the median of (10, 10, 55) ms is still 10
0.01
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
from typing import Callable

WINDOW = 9  # estimates in the median (one a second at most)
SLEW = 0.01  # s of change per s at most
STEP = 1.0  # s: farther than this, jump


class SteadyOffset:
    """``offset()``: seconds to add to this host's time; ``estimate()`` is Dask's raw figure.

    Thread-safe; cheap enough to call at every sample."""

    def __init__(self, estimate: Callable[[], float], clock: Callable[[], float] = time.monotonic):
        self._estimate, self._clock = estimate, clock
        self._estimates: collections.deque = collections.deque(maxlen=WINDOW)
        self._lock = threading.Lock()
        self._read_at = self._applied_at = None
        self._applied = 0.0
        self._target = None  # the median of the estimates: made again only when one is added

    def __call__(self) -> float:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= 1.0:
                self._read_at = now
                try:
                    self._estimates.append(float(self._estimate()))
                    self._target = statistics.median(self._estimates)
                except (TypeError, ValueError, AttributeError):  # not known yet: keep what we have
                    pass
            target = self._target
            if target is None:
                return self._applied
            if self._applied_at is None or abs(target - self._applied) > STEP:
                self._applied = target
            elif target != self._applied:  # (reached: nothing to move, the usual case)
                room = SLEW * max(now - self._applied_at, 0.0)
                self._applied += min(max(target - self._applied, -room), room)
            self._applied_at = now
            return self._applied
