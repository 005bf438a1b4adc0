"""Ask collected metrics questions: from InfluxDB (InfluxQL or Flux) or from a spool.

>>> from dask_influx_metrics import query                                    # doctest: +SKIP
>>> db = query.connect("http://127.0.0.1:8086", database="dask_metrics")     # doctest: +SKIP
>>> db = query.connect("/tmp/dask-influx-metrics-1000")   # a spool: the latest session  # doctest: +SKIP
>>> db.workers(), db.jobs(), db.dags(job=2)                                  # doctest: +SKIP
>>> tables = db.worker_tables(job=2, metrics=["mem-util", "compute-util"])  # doctest: +SKIP
>>> db.peaks("total-mem", per_job=True)        # tidy DataFrame, computed by the server  # doctest: +SKIP
>>> db.get_peaks("total-mem", workers=[0, 1])  # the old tool's list shapes  # doctest: +SKIP
>>> db.close()                                 # or: with query.connect(...) as db:  # doctest: +SKIP

Workers are numbered by address in natural order (``tcp://10.0.0.9:1`` before
``tcp://10.0.0.10:1``); ``db.worker_map()`` gives index -> address, and every
``workers=`` argument takes indices or addresses. Narrow what is read with
``start``/``stop`` (datetime, ISO string, or epoch seconds) and ``tags``
(extra tags every point carries, e.g. ``{"run": "nightly"}``).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from typing import Optional

import pandas as pd

from .base import QueryError, pending_notes
from .store import Store

__all__ = ["connect", "Store", "QueryError"]


def to_ns(when) -> Optional[int]:
    """datetime, ISO string, pandas Timestamp or epoch seconds -> epoch ns (None stays None).

    >>> to_ns(1.5)
    1500000000
    >>> to_ns("1970-01-01T00:00:02Z")
    2000000000
    """
    if when is None:
        return None
    if isinstance(when, bool):
        raise TypeError(f"not a time: {when!r}")
    if isinstance(when, (int, float)):
        return int(round(when * 1e9))
    if isinstance(when, _dt.datetime) and when.tzinfo is None:
        when = when.astimezone()  # naive = local time
    try:
        return int(
            pd.Timestamp(when).tz_localize("UTC").value
            if pd.Timestamp(when).tzinfo is None
            else pd.Timestamp(when).value
        )
    except (ValueError, TypeError):
        raise ValueError(f"not a time: {when!r} (use a datetime, an ISO string or epoch seconds)") from None


# How every Dask address starts (tcp://, tls://, inproc://, ucx://): a worker tag without it is another tool's.
_HOST_PORT = re.compile(r"^[\w.-]+:\d+(/.*)?$|^[a-zA-Z][\w+.-]*://")


def connect(
    source,
    database: str = "dask_metrics",
    *,
    language: str = "influxql",
    session=None,
    tags=None,
    start=None,
    stop=None,
    retention_policy=None,
    username=None,
    password=None,
    token=None,
    org=None,
    timeout: float = 30.0,
    undelivered=None,
    workers=None,
) -> "Store":
    """Open collected metrics: an InfluxDB URL (``http(s)://...``) or a spool folder.

    ``language`` is ``"influxql"`` (InfluxDB 1.x, 2.x through DBRP, 3.x) or
    ``"flux"`` (2.x, 1.8+; needs ``influxdb-client``; ``database`` is then the
    bucket, e.g. ``dask_metrics/autogen``). For a spool, ``session`` picks a
    session folder (default: the latest). Credentials (``username``/``password``,
    ``token``, or ``http://user:password@host``) travel only in the
    ``Authorization`` header; URLs shown anywhere carry none. ``undelivered``: a spool folder whose
    ``undelivered/``, ``refused/`` samples (not in InfluxDB) ``notes`` names; reading never writes them
    (``dask-influx-metrics replay`` does). ``workers``: the worker addresses whose series are read
    (``Monitor.query()`` passes its session's; default: every ``worker`` tag that is a Dask address,
    ``scheme://...``); ``notes`` names what is skipped (another tool's points). Raises :class:`QueryError`
    naming the URL or folder when it
    cannot be read. The :class:`Store` holds HTTP connections: ``close()`` it,
    or use it as ``with connect(...) as db:``.

    >>> connect("/nonexistent")
    Traceback (most recent call last):
    ...
    dask_influx_metrics.client.query.base.QueryError: spool folder '/nonexistent' does not exist
    >>> connect("127.0.0.1:8086")
    Traceback (most recent call last):
    ...
    dask_influx_metrics.client.query.base.QueryError: spool folder '127.0.0.1:8086' does not exist; for InfluxDB write the URL with its scheme: 'http://127.0.0.1:8086'
    """
    window = {"tags": tags, "start_ns": to_ns(start), "stop_ns": to_ns(stop)}
    source = os.fspath(source)
    if undelivered is not None and not source.startswith(("http://", "https://")):
        raise ValueError("undelivered= names samples not in InfluxDB: it needs an http(s):// source")
    if source.startswith(("http://", "https://")):
        if language == "influxql":
            from .influxql import InfluxQLBackend

            backend = InfluxQLBackend(source, database, retention_policy, username, password, token, timeout, **window)
        elif language == "flux":
            from .flux import FluxBackend

            backend = FluxBackend(
                source,
                database,
                org=org,
                token=token or (f"{username}:{password}" if username else None),
                timeout=timeout,
                **window,
            )
        else:
            raise ValueError(f"language must be 'influxql' or 'flux', got {language!r}")
    elif not os.path.exists(source) and _HOST_PORT.match(source):
        scheme = re.match(r"^([a-zA-Z][\w+.-]*)://", source)
        hint = f"'http://{source}'" if scheme is None else f"http:// or https://, not {scheme.group(1)}://"
        raise QueryError(f"spool folder {source!r} does not exist; for InfluxDB write the URL with its scheme: {hint}")
    else:
        from .spool import SpoolBackend

        backend = SpoolBackend(source, session=session, **window)
    backend.notes.extend(pending_notes(undelivered) if undelivered is not None else ())  # http(s) only
    return Store(backend, origin_ns=window["start_ns"], workers=workers, undelivered=undelivered)
