"""Delivery health: each sender's sink counters as ``delivery`` points (see :mod:`..schema`), sent through
the same sink every :data:`HEALTH_INTERVAL` s, so dashboards show what each sender delivered and lost."""

from __future__ import annotations

import logging
import threading
import time

from .. import lineprotocol, schema
from .base import Sink

logger = logging.getLogger(__name__)

HEALTH_INTERVAL = 10.0  # s between two delivery points of one sender


def health_points(sink: Sink, tags: dict, now_ns: int, field_tags: tuple = ()) -> list[bytes]:
    """Encoded ``delivery`` points, one per sink of ``sink`` (a FanOut or one sink): its cumulative counters
    since it was made (:meth:`~.base.Sink.delivery`). ``tags``: ``host``, ``worker`` (the sending role: a
    worker address, ``scheduler``, ...), ``session`` and the session's extra tags; ``sink`` is added here.
    ``field_tags``: tags written as fields instead (``Settings.field_tags``).

    >>> from .udp import UdpSink
    >>> health_points(UdpSink(("127.0.0.1", 9)), {"host": "h", "worker": "scheduler"}, 5)
    [b'delivery,host=h,sink=udp,worker=scheduler points_sent=0i,points_dropped=0i,points_refused=0i,points_spooled=0i,errors=0i 5']
    """
    points = []
    for one in sink.delivery():
        fields = {f: int(one.get(f, 0)) for f in schema.DELIVERY_FIELDS}
        point = schema.Point(schema.DELIVERY, {**tags, "sink": one["sink"]}, fields, int(now_ns))
        points.append(lineprotocol.tags_as_fields(point, field_tags))
    return lineprotocol.encode_many(points)


class HealthWriter:
    """Sends :func:`health_points` of ``sink`` into it every ``interval`` s (default
    :data:`HEALTH_INTERVAL`) from a daemon thread, and once more at :meth:`stop` (call it before
    closing the sink), so the last counts of a sender are on record."""

    def __init__(self, sink: Sink, tags: dict, interval: float | None = None, clock=time.time, field_tags: tuple = ()):
        self.sink, self.tags, self._clock, self.field_tags = sink, dict(tags), clock, tuple(field_tags)
        self.interval = HEALTH_INTERVAL if interval is None else float(interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="influx-delivery-health", daemon=True)
        self._thread.start()

    def write(self) -> None:
        """Send the points now; never raises (a sink's health must not take its sender down)."""
        try:
            self.sink.send(health_points(self.sink, self.tags, int(self._clock() * 1e9), self.field_tags))
        except Exception:
            logger.exception("delivery health: cannot write the counters")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def stop(self) -> None:
        """Stop the thread and write the final counts."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(5.0)
            self.write()
