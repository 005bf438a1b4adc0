"""What a session left on disk: written into InfluxDB (the explicit replay) or deleted.

An HTTP sink keeps what it could not deliver in ``undelivered/`` and what InfluxDB refused in ``refused/``
(:mod:`.paths`); nothing reads them into InfluxDB on its own (a reader only names them). The command line's
``dask-influx-metrics replay <folder> --source <url>`` calls :func:`replay_folders`. :func:`remove_spool` is
``Monitor.clear_metrics()``/``shutdown()``'s delete, run on each machine.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING

from .paths import REASONS_FILE, REFUSED_DIR, UNDELIVERED_DIR, pending_folders
from .spool import file_lines, spool_files

if TYPE_CHECKING:  # requests: imported when a replay posts, not by every process that imports the sinks
    from .http import HttpOptions, HttpSink

logger = logging.getLogger(__name__)


class _KeptInFile:
    """The fallback of a replay: lines not delivered stay in the file they came from."""

    def send(self, lines: list[bytes]) -> None:
        pass

    def take(self, lines: list[bytes]) -> int:
        return len(lines)

    def flush(self, drain: float = 0.0) -> None:
        pass

    def close(self) -> None:
        pass

    def counters(self) -> list[dict]:
        return []

    def delivery(self) -> list[dict]:
        return []


def replay_folders(folder, url: str, database: str, options: HttpOptions | None = None) -> dict:
    """Write the lines under every ``undelivered/`` and ``refused/`` folder below ``folder`` to InfluxDB.

    A file is deleted once each of its lines was written or refused again; lines refused again go to the
    ``refused/`` folder beside (with the new reason), and files the server did not take (down) are kept.
    ``options``: credentials, ``retention_policy``, ``timeout``. Returns counts: ``files``, ``lines``,
    ``written``, ``refused``, ``kept`` (not delivered, left in their files). Replay only folders no sink
    writes to (a session that stopped).

    >>> replay_folders("/nonexistent", "http://127.0.0.1:8086", "dask_metrics")
    {'files': 0, 'lines': 0, 'written': 0, 'refused': 0, 'kept': 0}
    """
    out = {"files": 0, "lines": 0, "written": 0, "refused": 0, "kept": 0}
    roots = pending_folders(folder)
    if not roots:
        return out
    from .http import HttpOptions, HttpSink

    options = dataclasses.replace(options or HttpOptions(), flush_interval=0.05)
    for root in roots:
        refused = os.path.join(os.path.dirname(root), REFUSED_DIR)
        out["files"] += len(spool_files(root))
        sink = HttpSink(url, database, options, fallback=_KeptInFile(), refused=refused)
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


def replay(directory, sink: HttpSink, remove: bool = False, batch_size: int = 5000, timeout: float = 60.0) -> int:
    """Send every spooled line under ``directory`` to ``sink``; return how many.

    Batches fit the sink's queue (``max_pending``), each waiting until there is room, so a replay never
    overflows it into the fallback. With ``remove=True`` a file is deleted once all its lines were
    delivered: the sink (drained, waiting at most ``timeout`` s per file) counted no failure while taking
    it. Files it did not take are kept, and named in a warning; their lines also reached the sink's
    fallback, so replay one or the other (a second write of a point is an idempotent overwrite in
    InfluxDB). Replay only directories no live process is still writing to, into a sink nothing else
    uses meanwhile.
    """
    total = 0
    kept = []
    batch_size = max(1, min(batch_size, sink.max_pending))
    for path in spool_files(directory):
        failures = sink.points_failed
        batch: list[bytes] = []
        for line in file_lines(path):
            batch.append(line)
            if len(batch) >= batch_size:
                _send_when_room(sink, batch)
                total, batch = total + len(batch), []
        if batch:
            _send_when_room(sink, batch)
            total += len(batch)
        if remove and sink.drain(timeout) and sink.points_failed == failures:
            os.remove(path)
        elif remove:
            kept.append(path)
    if kept:
        logger.warning("spool replay: kept %d file(s) not (fully) delivered: %s", len(kept), ", ".join(kept))
    return total


def _send_when_room(sink: HttpSink, lines: list[bytes], timeout: float = 60.0) -> None:
    """Send ``lines`` once they fit the sink's queue (or after ``timeout`` s: the overflow is then counted
    as failed, and its file kept)."""
    deadline = time.monotonic() + timeout
    while sink.pending and sink.pending + len(lines) > sink.max_pending and time.monotonic() < deadline:
        time.sleep(0.01)
    sink.send(lines)


def remove_spool(folders, keep=()) -> int:
    """Delete the spool files in ``folders`` (those on this machine), then the emptied folders and their
    session folder, except the folders in ``keep`` (still written to). Returns the files removed.

    >>> remove_spool(["/nonexistent/s1/w"])
    0
    """
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
