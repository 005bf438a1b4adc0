"""The sampling loop: collect points -> line protocol -> sink, on its own thread.

The schedule is drift-free: sample ``k`` is due at ``t0 + k * interval`` on
the monotonic clock, whatever each sample costs. When the thread falls more
than one interval behind (the process was frozen), the missed ticks are
skipped and counted rather than fired in a burst. :meth:`Sampler.wake` asks for
one extra sample before the next tick (a task started on a worker that the last
sample saw idle, so a graph shorter than the interval still shows up); at most
one extra sample per interval, but for urgent wakes (a worker arriving or
leaving, which waits for it: few). With ``sample_on_wake`` (the agent, whose wakes
come on a thread of their own) the waking thread takes that sample itself, one
sample at a time, and the sampling thread sleeps between ticks: a sleep costs a
thread ~70 us of CPU per wake here, an interruptible wait (a lock, a poll) ~100.

``collect(now_ns)`` returns the sample's points, tagged and timed (the agent's
:class:`~.collect.HostCollector`, a worker's custom metrics and task
stream), handed encoded to ``sink.send(lines)``; or a :class:`Sample`: its points and the lines it
forwards (the host's agent: its workers' outboxes), handed to ``sink.send(lines, forward)`` (a
:class:`~..sinks.sender.Sender`), whose answer (how many forwarded lines the sink took) goes to the
sample's ``then``. ``field_tags`` (``("dag",)`` with the setting ``dag-tag: false``) are written as
fields instead.

Example
-------
>>> from dask_influx_metrics.schema import Point
>>> s = Sampler(lambda now_ns: [Point("host", {"host": "h"}, {"cpu_percent": 5.0}, now_ns)], sink=None)
>>> [p.measurement for p in s.sample()]
['host']
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, NamedTuple

from .. import lineprotocol
from ..flag import Flag
from ..notices import Once
from ..schema import Point

logger = logging.getLogger(__name__)
STOP_LOOK_S = 1.0  # with sample_on_wake, the sampling thread sleeps at most this long at a time


class Sample(NamedTuple):
    """One sample that forwards lines made elsewhere: ``then(taken)`` hears how many of them the sink took."""

    points: list[Point]
    forward: list[bytes]
    then: Callable[[int], None]


class Sampler:
    """Calls ``collect(now_ns)`` every ``interval`` seconds and sends the points to ``sink``."""

    def __init__(
        self,
        collect: Callable[[int], list],
        sink,
        interval: float = 0.2,
        name: str = "influx-metrics-sampler",
        field_tags: tuple = (),
        sample_on_wake: bool = False,
    ):
        self.collect, self.sink, self.interval = collect, sink, float(interval)
        self._on_wake = sample_on_wake
        self._sampling = threading.Lock()  # one sample at a time (the waking thread's and the ticks)
        self._extra_taken = False  # sample_on_wake: an extra sample since the last tick
        self._field_tags = tuple(field_tags)  # tags written as fields (dag-tag: false)
        self._stopping = False  # set by stop(); nothing waits on it (the waits are on the wake flags)
        self._wake, self._urgent = Flag(), Flag()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._once = Once()
        self.samples = 0
        self.skipped = 0
        self.extra = 0  # samples taken on wake()
        self.origin: float | None = None  # time.monotonic() of sample 0: ticks fall on origin + k * interval
        self.gaps: collections.deque = collections.deque(maxlen=4096)  # seconds between sample starts
        self.costs: collections.deque = collections.deque(maxlen=4096)  # thread CPU seconds per sample

    def sample(self) -> list[Point]:
        """Take one sample now and return its points (does not send)."""
        return self._fields(self.collect(time.time_ns()))

    def _fields(self, points: list[Point]) -> list[Point]:
        if self._field_tags:
            return [lineprotocol.tags_as_fields(p, self._field_tags) for p in points]
        return points

    def sample_and_send(self) -> int:
        """One sample, encoded and handed to the sink (an empty one too: what it forwards goes with it);
        returns the line count."""
        sample = self.collect(time.time_ns())
        forwards = isinstance(sample, Sample)
        points = sample.points if forwards else sample
        lines = lineprotocol.encode_many(self._fields(points) if self._field_tags else points)
        try:
            if forwards:
                sample.then(self.sink.send(lines, sample.forward))
            else:
                self.sink.send(lines)
        except Exception as e:  # sinks promise not to raise; belt and braces
            self._report_once(self.sink, e)
        self.samples += 1
        return len(lines)

    def start(self) -> None:
        self._thread.start()

    def wake(self, urgent: bool = False) -> None:
        """Take one extra sample as soon as possible (ignored if one was taken since the last tick, unless
        ``urgent``); with ``sample_on_wake``, now, on the caller's thread."""
        if self._on_wake:
            with self._sampling:
                if self._stopping or not self._thread.is_alive() or (self._extra_taken and not urgent):
                    return
                self._extra_taken = True
                self._sample_safely()
                self.extra += 1
            return
        if urgent:
            self._urgent.set()
        self._wake.set()

    def stop(self, timeout: float = 5.0, final_sample: bool = False) -> None:
        """Stop the thread after the sample in progress; with ``final_sample``, take one more.
        Safe to call twice; the owner closes the sink and the sources."""
        self._stopping = True
        self._wake.set()
        self._urgent.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if final_sample:
            with self._sampling:
                self._sample_safely()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        due = self.origin = time.monotonic()
        last = None
        while not self._stopping:
            start = time.monotonic()
            if last is not None:
                self.gaps.append(start - last)
            last = start
            cpu = time.thread_time()
            if not self._on_wake:  # a wake before this sample is answered by it; one during it, after it
                self._wake.clear()
                self._urgent.clear()
            with self._sampling:
                self._extra_taken = False
                self._sample_safely()
            self.costs.append(time.thread_time() - cpu)
            due += self.interval
            now = time.monotonic()
            if now - due > self.interval:  # fell behind: skip, don't burst
                missed = int((now - due) // self.interval)
                self.skipped += missed
                due += missed * self.interval
            if self._on_wake:  # wakes are sampled by the waking thread; a stop is seen within STOP_LOOK_S
                while (left := due - time.monotonic()) > 0 and not self._stopping:
                    time.sleep(min(left, STOP_LOOK_S))
            elif self._wake.wait(max(0.0, due - now)) and not self._stopping:
                self._urgent.clear()
                self._sample_safely()
                self.extra += 1
                while self._urgent.wait(max(0.0, due - time.monotonic())) and not self._stopping:
                    self._urgent.clear()  # no other extra sample before the next tick, but urgent ones
                    self._sample_safely()
                    self.extra += 1

    def _sample_safely(self) -> None:
        try:
            self.sample_and_send()
        except Exception as e:
            self._report_once(self, e)

    def _report_once(self, where, error: Exception) -> None:
        key = (type(where).__name__, type(error).__name__)
        if self._once(key):
            logger.warning("influx-metrics: %s failed: %r (reported once)", key[0], error, exc_info=error)
