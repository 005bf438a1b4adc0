"""A sink that keeps what it is given (the whole :class:`~dask_influx_metrics.sinks.base.Sink` protocol): a
sampler's sink or an HTTP sink's fallback in tests."""

from __future__ import annotations

import threading


class ListSink:
    def __init__(self):
        self.lines: list[bytes] = []
        self.closed = False
        self._lock = threading.Lock()

    def send(self, lines):
        with self._lock:
            self.lines.extend(lines)

    def take(self, lines):
        self.send(lines)
        return len(lines)

    def flush(self, drain=0.0):
        pass

    def close(self):
        self.closed = True

    def counters(self):
        return [{"kind": "list", "points_written": len(self.lines)}]

    def delivery(self):
        return []
