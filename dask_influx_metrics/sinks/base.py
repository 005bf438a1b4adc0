"""What every sink does, so that no caller asks a sink what it can do: the :class:`Sink` protocol.

UdpSink, HttpSink, SpoolSink, FanOut and the worker's :class:`~dask_influx_metrics.link.outbox.Outbox`
implement all of it (``send`` and ``take``: see :class:`Sink`); a sink that has nothing to do for a call does nothing.

>>> from .udp import UdpSink
>>> fan = FanOut([UdpSink(("127.0.0.1", 9))])
>>> fan.flush(); [c["kind"] for c in fan.counters()], [d["sink"] for d in fan.delivery()]
(['udp'], ['udp'])
"""

from __future__ import annotations

from typing import Protocol


class Sink(Protocol):
    """Where encoded lines go, and what it did with them."""

    def send(self, lines: list[bytes]) -> None:
        """Hand encoded line-protocol lines (no newline) over for delivery; never raises, never blocks
        the sampler for long."""

    def take(self, lines: list[bytes]) -> int:
        """Hand ``lines`` over for good, in order, as far as it can: sent, or on disk (a spool file, an HTTP
        sink's undelivered copy); how many it took. The rest stays the caller's and is not counted as dropped:
        the host's agent gives its workers' outbox lines this way, and they wait in the outbox for the next
        sample until a sink has them ("sent" means the sink has it)."""

    def flush(self, drain: float = 0.0) -> None:
        """Put what is buffered on disk now; with ``drain`` (s), also post what is queued and wait at
        most that long (an HTTP sink: a worker's last samples are in InfluxDB when it leaves)."""

    def close(self) -> None:
        """Flush and release resources."""

    def counters(self) -> list[dict]:
        """``{"kind": ..., <counter>: int, ...}`` per sink (a FanOut: each of its sinks'), cumulative since
        it was made: what ``Monitor.delivery()`` and the agent's beat show."""

    def delivery(self) -> list[dict]:
        """The fields of its ``delivery`` points (:data:`~dask_influx_metrics.schema.DELIVERY_FIELDS`; absent
        ones are 0) with its ``sink`` tag, per sink that sends; [] for one whose lines another sender delivers."""


class FanOut:
    """Sends the same lines to several sinks."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = list(sinks)

    def send(self, lines: list[bytes]) -> None:
        for sink in self.sinks:
            sink.send(lines)

    def take(self, lines: list[bytes]) -> int:
        """As many as the sink that took most (it has them); a sink that took fewer is sent the difference, which
        it counts where it fails: no sink gets a line twice."""
        taken = [sink.take(lines) for sink in self.sinks]
        most = max(taken, default=0)
        for sink, n in zip(self.sinks, taken):
            if n < most:
                sink.send(lines[n:most])
        return most

    def flush(self, drain: float = 0.0) -> None:
        for sink in self.sinks:
            sink.flush(drain)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def counters(self) -> list[dict]:
        return [c for sink in self.sinks for c in sink.counters()]

    def delivery(self) -> list[dict]:
        return [d for sink in self.sinks for d in sink.delivery()]
