"""Sinks: where encoded lines go. Each has ``send(lines)`` and ``close()``.

``send`` takes a list of encoded line-protocol lines (``bytes``, no newline),
never raises and never blocks the sampler for long; ``close`` flushes.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Protocol

UNDELIVERED_DIR = "undelivered"  # <role>/undelivered: what an HTTP sink could not deliver (an outage)
REFUSED_DIR = "refused"  # <role>/refused: what InfluxDB refused as data, with reasons.txt


class Sink(Protocol):
    def send(self, lines: list[bytes]) -> None:
        """Hand lines over for delivery."""

    def close(self) -> None:
        """Flush what is buffered and release resources."""


def counters(sink) -> list[dict]:
    """Delivery counters of ``sink`` (each sink of a :class:`FanOut`): ``kind`` and its numeric counters.

    >>> from .udp import UdpSink
    >>> counters(UdpSink(("127.0.0.1", 9)))[0]["kind"]
    'udp'
    """
    names = (
        "points_sent",
        "datagrams_sent",
        "points_written",
        "points_dropped",
        "refused",
        "errors",
        "points_failed",
        "points_refused",
        "points_spooled",
        "batches_split",
    )
    out = []
    for one in getattr(sink, "sinks", [sink]):
        kind = type(one).__name__.removesuffix("Sink").lower()
        out.append({"kind": kind, **{n: getattr(one, n) for n in names if isinstance(getattr(one, n, None), int)}})
    return out


# ``delivery`` fields of one sink, from its counters (:func:`health_points`); absent counters are 0.
_HEALTH = {
    "udp": {"points_sent": "points_sent", "points_dropped": "points_dropped", "errors": "errors"},
    "http": {
        "points_sent": "points_written",
        "points_refused": "points_refused",
        "points_spooled": "points_spooled",
        "errors": "errors",
        "points_dropped": None,
    },  # failed and not spooled: lost (no fallback, or the fallback's disk failed)
    "spool": {"points_sent": "points_written", "points_dropped": "points_dropped"},
}


def health_points(sink, tags: dict, now_ns: int) -> list[bytes]:
    """Encoded ``delivery`` points (see :mod:`..schema`), one per sink of ``sink`` (a :class:`FanOut` or
    one sink): its cumulative counters since it was made. ``tags``: ``host``, ``worker`` (the sending
    role: a worker address, ``scheduler``, ...) and the session's extra tags; ``sink`` is added here.
    Send them into the same sink, e.g. every ~10 s.

    >>> from .udp import UdpSink
    >>> health_points(UdpSink(("127.0.0.1", 9)), {"host": "h", "worker": "scheduler"}, 5)
    [b'delivery,host=h,sink=udp,worker=scheduler points_sent=0i,points_dropped=0i,points_refused=0i,points_spooled=0i,errors=0i 5']
    """
    from .. import lineprotocol, schema

    points = []
    for one in getattr(sink, "sinks", [sink]):
        kind = type(one).__name__.removesuffix("Sink").lower()
        names = _HEALTH.get(kind)
        if names is None:
            continue
        fields = {f: int(getattr(one, names[f], 0) or 0) if names.get(f) else 0 for f in schema.DELIVERY_FIELDS}
        if kind == "http":
            fields["points_dropped"] = max(0, one.points_failed - one.points_spooled)
        points.append(schema.Point(schema.DELIVERY, {**tags, "sink": kind}, fields, int(now_ns)))
    return lineprotocol.encode_many(points)


HEALTH_INTERVAL = 10.0  # s between two delivery points of one sender


class HealthWriter:
    """Sends :func:`health_points` of ``sink`` into it every ``interval`` s (default
    :data:`HEALTH_INTERVAL`) from a daemon thread, and once more at :meth:`stop` (call it before
    closing the sink), so the last counts of a sender are on record."""

    def __init__(self, sink, tags: dict, interval: float | None = None, clock=time.time):
        self.sink, self.tags, self._clock = sink, dict(tags), clock
        self.interval = HEALTH_INTERVAL if interval is None else float(interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="influx-delivery-health", daemon=True)
        self._thread.start()

    def write(self) -> None:
        """Send the points now; never raises (a sink's health must not take its sender down)."""
        try:
            self.sink.send(health_points(self.sink, self.tags, int(self._clock() * 1e9)))
        except Exception:
            import logging

            logging.getLogger(__name__).exception("delivery health: cannot write the counters")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def stop(self) -> None:
        """Stop the thread and write the final counts."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(5.0)
            self.write()


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


def destinations(settings, session: str, role: str) -> dict:
    """Where ``role``'s samples go, as recorded on the scheduler (never credentials).

    ``sinks``; ``telegraf`` (host:port) with udp; ``influxdb`` (``url``, ``database``,
    ``retention_policy``) with http, or with udp when ``influxdb.url`` is configured (the
    InfluxDB Telegraf is assumed to feed); ``spool``: the folder (with http, its ``undelivered`` fallback);
    ``refused``: with http, the folder of the lines InfluxDB refused (and why);
    ``temporary``: the spool root is the default one (``Monitor.shutdown()`` deletes such files).

    >>> from dask_influx_metrics.config import Settings
    >>> destinations(Settings.resolve({"sink": "udp", "telegraf.address": "t:1"}), "s1", "w")["telegraf"]
    't:1'
    """
    out = {
        "sinks": list(settings.sinks),
        "telegraf": None,
        "influxdb": None,
        "spool": None,
        "temporary": "spool.directory" not in settings.configured,
    }
    if "udp" in settings.sinks:
        out["telegraf"] = "%s:%d" % settings.telegraf_address
    if "http" in settings.sinks or ("udp" in settings.sinks and "influxdb.url" in settings.configured):
        out["influxdb"] = {
            "url": settings.influxdb_url,
            "database": settings.database,
            "retention_policy": settings.retention_policy,
        }
    if "spool" in settings.sinks:
        out["spool"] = spool_dir(settings, session, role)
    elif "http" in settings.sinks:
        out["spool"] = os.path.join(spool_dir(settings, session, role), UNDELIVERED_DIR)
    if "http" in settings.sinks:
        out["refused"] = os.path.join(spool_dir(settings, session, role), REFUSED_DIR)
    return out


def make_sink(settings, role: str, session: str, report=None):
    """Build the sinks named by ``settings.sinks`` for one process.

    With ``http`` and no ``spool`` sink, lines that cannot be written are
    spooled to ``<spool dir>/undelivered`` so nothing is lost; with ``http``,
    lines InfluxDB refuses go to ``<spool dir>/refused`` with its reason (replay
    both with :func:`.http.replay_folders`, ``db.replay_undelivered()``). ``report(what, message)``
    hears of a Telegraf address where nothing listens (udp on loopback).
    """
    from .http import HttpSink
    from .spool import SpoolSink, private_folder
    from .udp import UdpSink

    directory = spool_dir(settings, session, role)
    if {"spool", "http"} & set(settings.sinks) and "spool.directory" not in settings.configured:
        private_folder(settings.spool_directory)  # the default root: this user's, closed to others
    spool = None
    sinks: list = []
    if "spool" in settings.sinks:
        spool = SpoolSink(directory, mem_limit=settings.mem_limit, flush_interval=settings.flush_interval)
        sinks.append(spool)
    if "udp" in settings.sinks:
        sinks.append(UdpSink(settings.telegraf_address, max_datagram=settings.max_datagram, report=report))
    if "http" in settings.sinks:
        fallback = (
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
                retention_policy=settings.retention_policy,
                username=settings.username,
                password=settings.password,
                token=settings.token,
                batch_size=settings.batch_size,
                timeout=settings.http_timeout,
                flush_interval=settings.flush_interval,
                fallback=fallback,
                refused=os.path.join(directory, REFUSED_DIR),
            )
        )
    return sinks[0] if len(sinks) == 1 else FanOut(sinks)


def remove_spool(folders, keep=()) -> int:
    """Delete the spool files in ``folders`` (those on this machine), then the emptied folders and their
    session folder, except the folders in ``keep`` (still written to). Returns the files removed.

    >>> remove_spool(["/nonexistent/s1/w"])
    0
    """
    from .spool import spool_files

    removed = 0
    for folder in folders:
        for path in spool_files(folder):
            try:
                os.remove(path)
                removed += 1
            except FileNotFoundError:
                pass
        if folder in keep or not os.path.isdir(folder):
            continue
        emptied = sorted((root for root, _, _ in os.walk(folder)), reverse=True)  # deepest first
        parent = os.path.dirname(folder)
        if os.path.basename(folder) in (UNDELIVERED_DIR, REFUSED_DIR):  # <session>/<worker>/undelivered
            emptied.append(parent)
            parent = os.path.dirname(parent)
        for path in emptied + [parent]:  # ends with the session folder
            try:
                os.rmdir(path)
            except OSError:  # not empty: someone else's files, or the session's other workers
                pass
    return removed


class _KeptInFile:
    """The fallback of a replay: lines not delivered stay in the file they came from."""

    def send(self, lines) -> None:
        pass

    def close(self) -> None:
        pass


def pending_folders(folder) -> list[str]:
    """Every ``undelivered/`` and ``refused/`` folder under ``folder`` that holds spool files.

    >>> pending_folders("/nonexistent")
    []
    """
    from .spool import spool_files

    return sorted(
        root
        for root, _, _ in os.walk(os.fspath(folder))
        if os.path.basename(root) in (UNDELIVERED_DIR, REFUSED_DIR) and spool_files(root)
    )


def replay_folders(folder, url: str, database: str, **options) -> dict:
    """Write the lines under every ``undelivered/`` and ``refused/`` folder below ``folder`` to InfluxDB.

    The explicit replay (reading never writes). A file is deleted once each of its lines was written or
    refused again; lines refused again go to the ``refused/`` folder beside (with the new reason), and
    files the server did not take (down) are kept. ``options`` go to :class:`HttpSink` (credentials,
    ``retention_policy``, ``timeout``, ``session``). Returns counts: ``files``, ``lines``, ``written``,
    ``refused``, ``kept`` (not delivered, left in their files). Replay only folders no sink writes to.
    """
    from .http import REASONS_FILE, HttpSink
    from .spool import replay, spool_files

    out = {"files": 0, "lines": 0, "written": 0, "refused": 0, "kept": 0}
    for root in pending_folders(folder):
        refused = os.path.join(os.path.dirname(root), REFUSED_DIR)
        out["files"] += len(spool_files(root))
        sink = HttpSink(url, database, fallback=_KeptInFile(), refused=refused, flush_interval=0.05, **options)
        try:
            out["lines"] += replay(root, sink, remove=True)
        finally:
            sink.close()
        out["written"] += sink.points_written
        out["refused"] += sink.points_refused
        out["kept"] += sink.points_failed
        if not spool_files(refused):
            try:
                os.remove(os.path.join(refused, REASONS_FILE))  # nothing refused is left: no stale reasons
            except FileNotFoundError:
                pass
    return out
