"""The sinks one process sends through, built from its settings (``sink``: udp, http, spool, or several)."""

from __future__ import annotations

import os

from .base import FanOut, Sink
from .paths import REFUSED_DIR, UNDELIVERED_DIR, spool_dir
from .spool import SpoolSink, private_folder
from .udp import UdpSink


def make_sink(settings, role: str, session: str, report=None) -> Sink:
    """Build the sinks named by ``settings.sinks`` for one process (``role``: see :mod:`.paths`).

    With ``http`` and no ``spool`` sink, lines that cannot be written are spooled to
    ``<spool dir>/undelivered`` so nothing is lost; with ``http``, lines InfluxDB refuses go to
    ``<spool dir>/refused`` with its reason (both written later by the explicit replay, :mod:`.replay`).
    ``report(what, message)`` hears of a Telegraf address where nothing listens (udp on loopback).
    """
    directory = spool_dir(settings, session, role)
    if {"spool", "http"} & set(settings.sinks) and "spool.directory" not in settings.configured:
        private_folder(settings.spool_directory)  # the default root: this user's, closed to others
    spool = None
    sinks: list[Sink] = []
    if "spool" in settings.sinks:
        spool = SpoolSink(directory, mem_limit=settings.mem_limit, flush_interval=settings.flush_interval)
        sinks.append(spool)
    if "udp" in settings.sinks:
        sinks.append(UdpSink(settings.telegraf_address, max_datagram=settings.max_datagram, report=report))
    if "http" in settings.sinks:
        from .http import HttpOptions, HttpSink  # requests: imported only by a process that posts

        options = HttpOptions(
            retention_policy=settings.retention_policy,
            username=settings.username,
            password=settings.password,
            token=settings.token,
            batch_size=settings.batch_size,
            timeout=settings.http_timeout,
            flush_interval=settings.flush_interval,
            create_database=settings.create_database,
        )
        fallback = (  # beside a spool sink, the lines are on disk already
            None
            if spool
            else SpoolSink(
                os.path.join(directory, UNDELIVERED_DIR),
                mem_limit=settings.mem_limit,
                flush_interval=settings.flush_interval,
            )
        )
        sinks.append(
            HttpSink(
                settings.influxdb_url,
                settings.database,
                options,
                fallback=fallback,
                refused=os.path.join(directory, REFUSED_DIR),
            )
        )
    return sinks[0] if len(sinks) == 1 else FanOut(sinks)
