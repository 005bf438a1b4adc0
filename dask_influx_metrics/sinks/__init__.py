"""Sinks: where encoded lines go. Every sink is a :class:`~.base.Sink` (send, flush, close, counters,
delivery): :mod:`.udp`, :mod:`.http`, :mod:`.spool`, :class:`~.base.FanOut`.

By concern: :mod:`.base` (the protocol, FanOut), :mod:`.factory` (the sinks of one process, from its
settings), :mod:`.health` (``delivery`` points), :mod:`.paths` (spool folders, recorded destinations),
:mod:`.replay` (what a session left on disk: replayed into InfluxDB, or deleted).
"""

from .base import FanOut, Sink
from .factory import make_sink
from .health import HEALTH_INTERVAL, HealthWriter, health_points
from .paths import REASONS_FILE, REFUSED_DIR, UNDELIVERED_DIR, destinations, pending_folders, spool_dir
from .replay import remove_spool, replay_folders
from .spool import SpoolSink
from .udp import UdpSink

__all__ = [
    "Sink",
    "FanOut",
    "UdpSink",
    "SpoolSink",
    "HttpSink",
    "HttpOptions",
    "make_sink",
    "HEALTH_INTERVAL",
    "HealthWriter",
    "health_points",
    "UNDELIVERED_DIR",
    "REFUSED_DIR",
    "REASONS_FILE",
    "destinations",
    "spool_dir",
    "pending_folders",
    "replay_folders",
    "remove_spool",
]


def __getattr__(name: str):
    """``HttpSink`` and ``HttpOptions`` on first use: they import ``requests`` (6.5 MiB), which a host's
    agent that sends over UDP or to the spool never needs."""
    if name in ("HttpSink", "HttpOptions"):
        from . import http

        return getattr(http, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
