"""The spool through the cluster: read a session spooled in folders this machine cannot see.

Each spooling worker (and the scheduler, for its ``dag`` points) recorded its
spool folder on the session; an HTTP sink's worker, its ``undelivered/`` folder. :func:`fetch` copies those folders' files into a
private local folder over Dask's own comms, one worker and one chunk of at most
:data:`CHUNK` bytes at a time (``client.run`` on that worker,
``run_on_scheduler`` for the scheduler), so scheduler and workers never hold
more than one chunk of it. The copy is then read exactly as a local spool is,
so tables, peaks and CSV files are the same as reading the folder directly.
A worker that has left the cluster cannot be read: its samples are skipped with
a warning naming it.

Example
-------
>>> folder = fetch(client, monitor.jobs()["destinations"], session_id, "/tmp/copy")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os

from ..sinks.spool import spool_files

logger = logging.getLogger(__name__)

CHUNK = 4 << 20  # bytes per round trip


def listing(folder: str) -> list[tuple[str, int]]:
    """Runs where the folder is: its spool files as (path relative to it, size now).

    >>> listing("/nonexistent")
    []
    """
    return [(os.path.relpath(path, folder), os.path.getsize(path)) for path in spool_files(folder)]


def chunk(path: str, offset: int, size: int) -> bytes:
    """Runs where the file is: ``size`` bytes of it from ``offset``."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def _runner(client, who: str, live):
    if who == "scheduler":
        return lambda f, *args: client.run_on_scheduler(f, *args)
    if who not in live:
        return None
    return lambda f, *args: client.run(f, *args, workers=[who])[who]


def fetch(client, destinations: dict, session_id: str, into: str) -> str:
    """Copy the spool files of ``destinations`` (``Monitor.jobs()["destinations"]``) to
    ``<into>/<session_id>/<worker folder>/``; returns that session folder."""
    target = os.path.join(into, session_id)
    os.makedirs(target, mode=0o700, exist_ok=True)
    live = set(client.scheduler_info()["workers"])
    done = set()  # (host, folder): the workers of a host share their agent's folder, copied once
    for who, where in sorted(destinations.items()):
        if not where.get("spool") or (where.get("host"), where["spool"]) in done:  # spool, or undelivered/
            continue
        run = _runner(client, who, live)
        if run is None:
            logger.warning(
                "influx-metrics: worker %s (host %s) has left the cluster; its spooled samples under %s "
                "cannot be read through the cluster",
                who,
                where.get("host"),
                where["spool"],
            )
            continue
        folder = where["spool"]  # <session>/<worker>, or <session>/<worker>/undelivered: keep that shape
        parts = (
            [os.path.basename(os.path.dirname(folder)), "undelivered"]
            if os.path.basename(folder) == "undelivered"
            else [os.path.basename(folder)]
        )
        local = os.path.join(target, *parts)
        for relative, size in run(listing, where["spool"]):
            path = os.path.join(local, relative)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(path, "wb") as out:
                offset = 0
                while offset < size:
                    data = run(chunk, os.path.join(where["spool"], relative), offset, min(CHUNK, size - offset))
                    if not data:
                        break
                    out.write(data)
                    offset += len(data)
        done.add((where.get("host"), where["spool"]))
    return target
