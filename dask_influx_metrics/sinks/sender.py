"""A sampling process's one way out: each sample's lines, after the lines it forwards (the workers' outboxes,
beside the host's agent), handed to its sink for good, with the sink's ``delivery`` points every
:data:`~.health.HEALTH_INTERVAL`.

"For good" is :meth:`~.base.Sink.take`: sent, or written through to the spool or an HTTP sink's undelivered
copy, so a killed sampler loses nothing it sampled. What the sink could not take of the sample's own lines is
handed to ``send`` (counted where it fails); forwarded lines it did not take stay where they came from (the
caller learns how many it took and tells their outboxes).

>>> class Kept:
...     def __init__(self): self.lines = []
...     def take(self, lines): self.lines += lines; return len(lines)
...     def flush(self, drain=0.0): pass
...     def delivery(self): return [{"sink": "spool", "points_spooled": len(self.lines)}]
>>> sink = Kept()
>>> sender = Sender(sink, {"host": "h", "worker": "agent-h"}, clock=lambda: 1.0)
>>> sender.send([b"host cpu_percent=1 1"], forward=[b"task duration=2 1"])
1
>>> [line.split(b",")[0].split(b" ")[0] for line in sink.lines]  # forwarded, own, then delivery
[b'task', b'host', b'delivery']
"""

from __future__ import annotations

import time

from .base import Sink
from .health import HEALTH_INTERVAL, health_points


class Sender:
    """Hands each sample to ``sink`` (see the module docstring); ``tags``: the delivery points' (None: none)."""

    def __init__(self, sink: Sink, tags: dict | None, field_tags: tuple = (), clock=time.time):
        self.sink, self._tags, self._field_tags, self._clock = sink, tags, tuple(field_tags), clock
        self._health_at = -HEALTH_INTERVAL  # the first sample carries them

    def send(self, lines: list[bytes], forward: list[bytes] = ()) -> int:
        """``forward`` then ``lines`` (and the delivery points when due) to the sink, flushed; how many of
        ``forward`` it took."""
        now = self._clock()
        if self._tags is not None and now - self._health_at >= HEALTH_INTERVAL:
            self._health_at = now
            lines = lines + health_points(self.sink, self._tags, int(now * 1e9), self._field_tags)
        ahead = len(forward)
        everything = [*forward, *lines] if ahead else lines
        taken = self.sink.take(everything)
        if taken < len(everything):  # the sample's own lines the sink could not keep: counted where they fail
            self.sink.send(lines[max(0, taken - ahead) :])
        self.sink.flush()
        return min(taken, ahead)

    def health_now(self) -> None:
        """The next :meth:`send` carries the delivery points (the last counts of a sampler that stops)."""
        self._health_at = -HEALTH_INTERVAL
