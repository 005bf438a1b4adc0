"""Sinks: where encoded lines go. Each has ``send(lines)`` and ``close()``.

``send`` takes a list of encoded line-protocol lines (``bytes``, no newline),
never raises and never blocks the sampler for long; ``close`` flushes.
"""

from __future__ import annotations

import os
from typing import Protocol


class Sink(Protocol):
    def send(self, lines: list[bytes]) -> None:
        """Hand lines over for delivery."""

    def close(self) -> None:
        """Flush what is buffered and release resources."""


class FanOut:
    """Sends the same lines to several sinks."""

    def __init__(self, sinks: list):
        self.sinks = list(sinks)

    def send(self, lines: list[bytes]) -> None:
        for sink in self.sinks:
            sink.send(lines)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def safe_name(text: str) -> str:
    """A file-system safe name for a worker address or name.

    >>> safe_name("tcp://127.0.0.1:4012")
    'tcp-127.0.0.1-4012'
    """
    out = "".join(c if c.isalnum() or c in "._" else "-" for c in str(text))
    return "-".join(p for p in out.split("-") if p) or "unnamed"


def spool_dir(settings, session: str, role: str) -> str:
    """Where ``role`` (a worker address, or ``scheduler``) spools for ``session``."""
    return os.path.join(settings.spool_directory, session, safe_name(role))


def make_sink(settings, role: str, session: str):
    """Build the sinks named by ``settings.sinks`` for one process.

    With ``http`` and no ``spool`` sink, lines that cannot be written are
    spooled to ``<spool dir>/undelivered`` so nothing is lost (replay them
    with :func:`dask_influx_metrics.worker.sinks.spool.replay`).
    """
    from .http import HttpSink
    from .spool import SpoolSink
    from .udp import UdpSink

    directory = spool_dir(settings, session, role)
    spool = None
    sinks: list = []
    if "spool" in settings.sinks:
        spool = SpoolSink(directory, mem_limit=settings.mem_limit, flush_interval=settings.flush_interval)
        sinks.append(spool)
    if "udp" in settings.sinks:
        sinks.append(UdpSink(settings.telegraf_address, max_datagram=settings.max_datagram))
    if "http" in settings.sinks:
        fallback = None if spool else SpoolSink(
            os.path.join(directory, "undelivered"), mem_limit=settings.mem_limit,
            flush_interval=settings.flush_interval)
        sinks.append(HttpSink(
            settings.influxdb_url, settings.database, retention_policy=settings.retention_policy,
            username=settings.username, password=settings.password, token=settings.token,
            batch_size=settings.batch_size, timeout=settings.http_timeout, fallback=fallback))
    return sinks[0] if len(sinks) == 1 else FanOut(sinks)
