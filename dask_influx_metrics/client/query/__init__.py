"""Ask collected metrics questions: from InfluxDB (InfluxQL or Flux) or from a spool.

>>> from dask_influx_metrics import query                                    # doctest: +SKIP
>>> db = query.connect("http://127.0.0.1:8086", database="dask_metrics")     # doctest: +SKIP
>>> db = query.connect("/tmp/dask-influx-metrics-1000")   # a spool: the latest session  # doctest: +SKIP
>>> db.sessions()                              # every session there, newest first  # doctest: +SKIP
>>> db.workers(), db.jobs(), db.dags(job=2)                                  # doctest: +SKIP
>>> db.metrics(), db.fields(), db.hosts()                                    # doctest: +SKIP

The Store reads; the analyses take it as their first argument (all on the public path
``dask_influx_metrics.query``, each from its module under :mod:`dask_influx_metrics.client`):

>>> tables = query.worker_tables(db, job=2, metrics=["mem-util", "compute-util"])  # doctest: +SKIP
>>> query.peaks(db, "total-mem", per_job=True)        # tidy DataFrame, computed by the server  # doctest: +SKIP
>>> query.get_peaks(db, "total-mem", workers=[0, 1])  # the old tool's list shapes  # doctest: +SKIP
>>> db.close()                                 # or: with query.connect(...) as db:  # doctest: +SKIP

A database holds many monitoring sessions, and job and DAG numbers restart at 1
in each: a Store reads one, by default the latest, named in ``db.notes`` when
there are others; ``session=`` picks another (an id, ``"all"``, or ``2`` for the
one before the latest), and ``db.sessions()`` lists them (:mod:`.sessions`).

Workers are numbered by address in natural order (``tcp://10.0.0.9:1`` before
``tcp://10.0.0.10:1``); ``db.worker_map()`` gives index -> address, and every
``workers=`` argument takes indices or addresses. Narrow what is read with
``start``/``stop`` (datetime, ISO string, or epoch seconds) and ``tags``
(extra tags every point carries, e.g. ``{"run": "nightly"}``).
"""

from __future__ import annotations

import os
import re

from . import sessions
from .base import QueryError, ReadOptions, pending_notes, to_ns
from .store import Store

__all__ = ["connect", "Store", "QueryError", "ReadOptions", "to_ns"]


# How every Dask address starts (tcp://, tls://, inproc://, ucx://): a worker tag without it is another tool's.
_HOST_PORT = re.compile(r"^[\w.-]+:\d+(/.*)?$|^[a-zA-Z][\w+.-]*://")


def connect(source, database: str = "dask_metrics", **options) -> "Store":
    """Open collected metrics: an InfluxDB URL (``http(s)://...``) or a spool folder.

    ``options`` are the keywords of :class:`~.base.ReadOptions`: ``start``/``stop``, ``tags``, ``session``
    (default: the latest in range; an id, ``"all"`` or an index from the latest, see :mod:`.sessions`), ``language`` (``"flux"``: ``database`` is the bucket), credentials, ``org``, ``timeout``,
    ``undelivered``, ``workers``. Raises :class:`QueryError` naming the URL or folder when it cannot be
    read. The :class:`Store` holds HTTP connections: ``close()`` it, or use it as ``with connect(...) as db:``.

    >>> connect("/nonexistent")
    Traceback (most recent call last):
    ...
    dask_influx_metrics.client.query.base.QueryError: spool folder '/nonexistent' does not exist
    >>> connect("127.0.0.1:8086")
    Traceback (most recent call last):
    ...
    dask_influx_metrics.client.query.base.QueryError: spool folder '127.0.0.1:8086' does not exist; for InfluxDB write the URL with its scheme: 'http://127.0.0.1:8086'
    >>> connect("/nonexistent", statr=1)
    Traceback (most recent call last):
    ...
    TypeError: ReadOptions.__init__() got an unexpected keyword argument 'statr'
    """
    read = ReadOptions(**options)
    source = os.fspath(source)
    url = source.startswith(("http://", "https://"))
    if read.undelivered is not None and not url:
        raise ValueError("undelivered= names samples not in InfluxDB: it needs an http(s):// source")
    if url and read.language == "influxql":
        from .influxql import InfluxQLBackend

        backend = InfluxQLBackend(source, database, read)
    elif url and read.language == "flux":
        from .flux import FluxBackend

        backend = FluxBackend(source, database, read)
    elif url:
        raise ValueError(f"language must be 'influxql' or 'flux', got {read.language!r}")
    elif not os.path.exists(source) and _HOST_PORT.match(source):
        scheme = re.match(r"^([a-zA-Z][\w+.-]*)://", source)
        hint = f"'http://{source}'" if scheme is None else f"http:// or https://, not {scheme.group(1)}://"
        raise QueryError(f"spool folder {source!r} does not exist; for InfluxDB write the URL with its scheme: {hint}")
    else:
        from .spool import SpoolBackend

        backend = SpoolBackend(source, read)
    try:
        note = sessions.select(backend, read.session)
    except BaseException:
        backend.close()
        raise
    backend.notes.extend(pending_notes(read.undelivered) if read.undelivered is not None else ())  # http(s) only
    return Store(
        backend,
        origin_ns=read.start_ns,
        workers=read.workers,
        undelivered=read.undelivered,
        session_note=note,
    )
