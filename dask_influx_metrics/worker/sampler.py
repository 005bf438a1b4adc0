"""The sampling loop: sources -> points -> line protocol -> sink, on its own thread.

The schedule is drift-free: sample ``k`` is due at ``t0 + k * interval`` on
the monotonic clock, whatever each sample costs. When the thread falls more
than one interval behind (the process was frozen, a task held the GIL), the
missed ticks are skipped and counted rather than fired in a burst.
:meth:`Sampler.wake` asks for one extra sample before the next tick (the worker
plugin calls it when a task starts on a worker that its last sample saw idle,
so a graph shorter than the interval still shows up); at most one extra sample
per interval.

Every sample is tagged with the common tags of one activity snapshot, so the
``job``/``dag`` tags and the ``running`` field always agree. ``field_tags``
(``("dag",)`` with the setting ``dag-tag: false``) are written as fields instead.

Example
-------
>>> from dask_influx_metrics.schema import Reading
>>> class One:
...     def read(self):
...         return [Reading("host", {}, {"cpu_percent": 5.0})]
>>> s = Sampler([One()], sink=None, tags=lambda: {"host": "h", "worker": "w", "job": "1", "dag": "0"})
>>> [p.measurement for p in s.sample()]
['host']
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from .. import lineprotocol
from ..schema import Point, tags_as_fields

logger = logging.getLogger(__name__)


class Sampler:
    """Reads ``sources`` every ``interval`` seconds and sends to ``sink``; ``stop()`` closes ``owned``."""

    def __init__(
        self,
        sources: list,
        sink,
        tags: Callable[[], dict],
        interval: float = 0.2,
        before_sample: Callable[[], None] = lambda: None,
        clock_offset: Callable[[], float] = lambda: 0.0,
        name: str = "influx-metrics-sampler",
        owned: tuple = (),
        streams: tuple = (),
        field_tags: tuple = (),
    ):
        self.sources, self.sink, self.interval = list(sources), sink, float(interval)
        self._tags, self._before, self._offset = tags, before_sample, clock_offset
        self._owned = owned  # closed by stop(): parts only this sampler uses (the host source's lock)
        self._streams = streams  # points(now_ns) -> points with tags and times of their own (task stream)
        self._field_tags = tuple(field_tags)  # common tags written as fields (dag-tag: false)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._broken: set[tuple] = set()
        self.samples = 0
        self.skipped = 0
        self.extra = 0  # samples taken on wake()
        self.gaps: collections.deque = collections.deque(maxlen=4096)  # seconds between sample starts
        self.costs: collections.deque = collections.deque(maxlen=4096)  # thread CPU seconds per sample

    def sample(self) -> list[Point]:
        """Take one sample now and return its points (does not send)."""
        self._before()
        common = self._tags()
        now_ns = time.time_ns() + int(self._offset() * 1e9)
        merged: dict[tuple, Point] = {}
        for source in self.sources:
            try:
                readings = source.read()
            except Exception as e:  # a source must not kill the loop
                self._report_once(source, e)
                continue
            for r in readings:
                key = (r.measurement, tuple(sorted(r.tags.items())))
                if key in merged:
                    merged[key].fields.update(r.fields)
                else:
                    merged[key] = Point(r.measurement, {**common, **r.tags}, dict(r.fields), now_ns)
        points = list(merged.values())
        for stream in self._streams:
            try:
                points += stream.points(now_ns)
            except Exception as e:
                self._report_once(stream, e)
        if self._field_tags:
            return [tags_as_fields(p, self._field_tags) for p in points]
        return points

    def sample_and_send(self) -> int:
        """One sample, encoded and handed to the sink; returns the line count."""
        lines = lineprotocol.encode_many(self.sample())
        if lines:
            try:
                self.sink.send(lines)
            except Exception as e:  # sinks promise not to raise; belt and braces
                self._report_once(self.sink, e)
        self.samples += 1
        return len(lines)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Take one extra sample as soon as possible (ignored if one was taken since the last tick)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0, final_sample: bool = False) -> None:
        """Stop the thread after the sample in progress; with ``final_sample``, take one more
        (sources still open); then stop the threads of sources that have a ``stop()`` (custom
        metrics) and close the parts this sampler owns. Safe to call twice."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if final_sample:
            self.sample_and_send()
        for source in self.sources:
            if callable(getattr(source, "stop", None)):
                source.stop()
        for part in self._owned:
            part.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        due = time.monotonic()
        last = None
        while not self._stop.is_set():
            start = time.monotonic()
            if last is not None:
                self.gaps.append(start - last)
            last = start
            cpu = time.thread_time()
            self._wake.clear()  # a wake before this sample is answered by it; one during it, after it
            self._sample_safely()
            self.costs.append(time.thread_time() - cpu)
            due += self.interval
            now = time.monotonic()
            if now - due > self.interval:  # fell behind: skip, don't burst
                missed = int((now - due) // self.interval)
                self.skipped += missed
                due += missed * self.interval
            if self._wake.wait(max(0.0, due - now)) and not self._stop.is_set():
                self._sample_safely()
                self.extra += 1
                self._stop.wait(max(0.0, due - time.monotonic()))

    def _sample_safely(self) -> None:
        try:
            self.sample_and_send()
        except Exception as e:
            self._report_once(self, e)

    def _report_once(self, where, error: Exception) -> None:
        key = (type(where).__name__, type(error).__name__)
        if key not in self._broken:
            self._broken.add(key)
            logger.warning("influx-metrics: %s failed: %r (reported once)", key[0], error, exc_info=error)
