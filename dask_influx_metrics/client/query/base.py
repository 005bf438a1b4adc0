"""What every query backend shares: the error type and the shape of a long frame.

A backend (``influxql.py``, ``flux.py``, ``spool.py``) is a :class:`Backend`:
it answers ``fields()``, ``tag_values(key)``, ``first_time()``, ``last_time()``,
``frame(measurement, fields, worker, job, host=None)`` (long samples: ``time`` in ns,
``job``, ``dag``, ``index`` for device points, one column per field; with
``host`` and ``worker=None``, every worker's points of that host and their
``worker``: how the one ``host`` series of a host is read),
``max_by(measurement, field, by, workers, job, busy)`` (``busy``: samples
with ``dag != "0"`` only), ``dag_points()``, ``points(measurement, columns)``
(every point: ``time`` and the named tags or fields, e.g. ``task`` points) and
``last_by(measurement, fields, by)`` (per distinct value of the tags ``by``, each field's last value:
the ``accounting`` totals), all within its time range (``start_ns``, ``stop_ns``) and ``tags``, and in
its one session (``session_rows(detail)`` lists the sessions its source holds, ``select_session(id)``
narrows it to one: :mod:`.sessions`); ``describe()`` names what it reads,
``notes`` lists what its answers should be read with (skipped lines,
undelivered samples), ``widened()`` is the same source without range and
tags, and ``close()`` releases its connections. Everything else is built on those in
:mod:`dask_influx_metrics.query`.

>>> list(empty_frame(["utilization_gpu"], device=True).columns)
['time', 'job', 'dag', 'index', 'utilization_gpu']
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import os
from typing import Any, Optional, Protocol

import pandas as pd

from ... import schema

# Measurements that hold worker samples, and those whose points carry device tags.
SAMPLE_MEASUREMENTS = (schema.GPU, schema.HOST, schema.WORKER, schema.CUSTOM)
DEVICE_MEASUREMENTS = (schema.GPU, schema.CUSTOM)
# Where a session's points are looked for: every measurement a session writes (delivery: even one that ran nothing).
SESSION_MEASUREMENTS = (*SAMPLE_MEASUREMENTS, schema.TASK, schema.ACTIVITY, schema.DAG, schema.DELIVERY)


class Backend(Protocol):
    """What :class:`~dask_influx_metrics.query.Store` asks of a backend."""

    language: str
    tags: dict
    start_ns: Optional[int]
    stop_ns: Optional[int]
    notes: list[str]
    session: Optional[str]  # the session read ("" the points without one); None: every session

    def describe(self) -> str: ...
    def session_rows(self, detail: bool = False) -> pd.DataFrame: ...
    def select_session(self, session: str) -> None: ...
    def widened(self) -> "Backend": ...
    def fields(self) -> dict[str, list[str]]: ...
    def tag_values(self, key: str) -> list[str]: ...
    def first_time(self) -> Optional[int]: ...
    def last_time(self) -> Optional[int]: ...
    def frame(
        self,
        measurement: str,
        fields: list[str],
        worker: Optional[str],
        job: Optional[int] = None,
        host: Optional[str] = None,
    ) -> pd.DataFrame: ...
    def max_by(self, measurement: str, field: str, by: tuple, workers=None, job=None, busy=False) -> pd.DataFrame: ...
    def dag_points(self) -> pd.DataFrame: ...
    def points(self, measurement: str, columns: list[str]) -> pd.DataFrame: ...
    def last_by(self, measurement: str, fields: list[str], by: tuple) -> pd.DataFrame: ...
    def close(self) -> None: ...


class QueryError(RuntimeError):
    """A question the data cannot answer: unreachable server, unknown database, bad name."""


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


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How :func:`~dask_influx_metrics.query.connect` reads: its keywords besides the source and database,
    which it passes on to the backend and the :class:`~.store.Store`.

    ``language``: ``"influxql"`` (InfluxDB 1.x, 2.x through DBRP, 3.x) or ``"flux"`` (2.x, 1.8+; needs
    ``influxdb-client``; the database is then the bucket, e.g. ``dask_metrics/autogen``). ``session``: the
    monitoring session to read: an id (a spool's session folder), ``"all"``, or an index from the latest
    (``1``, ``"2"``); default: the latest, named in ``notes`` when there are others (:mod:`.sessions`).
    ``tags``: extra tags every point read carries;
    ``start``/``stop``: datetime, ISO string or epoch seconds. Credentials (``username``/``password``,
    ``token``, or ``http://user:password@host``) travel only in the ``Authorization`` header; URLs shown
    anywhere carry none, nor does this object's ``repr``. ``org``: Flux's organization; ``timeout``: s per
    HTTP request. ``undelivered``: a spool folder whose ``undelivered/``, ``refused/`` samples (not in
    InfluxDB) ``notes`` names; reading never writes them (``dask-influx-metrics replay`` does).
    ``workers``: the worker addresses whose series are read (``Monitor.query()`` passes its session's;
    default: every ``worker`` tag that is a Dask address, ``scheme://...``); ``notes`` names what is
    skipped (another tool's points).

    >>> ReadOptions(start=1.5, password="secret").start_ns, "secret" in repr(ReadOptions(password="secret"))
    (1500000000, False)
    """

    language: str = "influxql"
    session: Any = None
    tags: Optional[dict] = None
    start: Any = None
    stop: Any = None
    retention_policy: Optional[str] = None
    username: Optional[str] = None
    password: Optional[str] = dataclasses.field(default=None, repr=False)
    token: Optional[str] = dataclasses.field(default=None, repr=False)
    org: Optional[str] = None
    timeout: float = 30.0
    undelivered: Any = None
    workers: Any = None

    @property
    def start_ns(self) -> Optional[int]:
        return to_ns(self.start)

    @property
    def stop_ns(self) -> Optional[int]:
        return to_ns(self.stop)


# Tags read as strings, never numbers ("1,2" or "01" must survive).
TAG_DTYPES = {
    "job": str,
    "dag": str,
    "index": str,
    "worker": str,
    "host": str,
    "uuid": str,
    "name": str,
    schema.SESSION: str,
}


def empty_frame(fields, device: bool) -> pd.DataFrame:
    return pd.DataFrame(columns=["time", "job", "dag"] + (["index"] if device else []) + list(fields))


def widened(backend, **fresh):
    """A shallow copy of ``backend`` (sharing its connections) without time range and tags;
    ``fresh`` replaces attributes that hold answers for the range (caches)."""
    wide = copy.copy(backend)
    wide.tags, wide.start_ns, wide.stop_ns = {}, None, None
    for name, value in fresh.items():
        setattr(wide, name, value)
    return wide


def pending_notes(folder) -> list[str]:
    """One note per ``undelivered/`` or ``refused/`` folder under ``folder`` that holds samples
    (not in InfluxDB), saying how to write them.

    >>> pending_notes("/nonexistent")
    []
    """
    from ...sinks.paths import REASONS_FILE, REFUSED_DIR, pending_folders
    from ...sinks.spool import read_lines

    notes = []
    for root in pending_folders(folder):
        count = sum(1 for _ in read_lines(root))
        if os.path.basename(root) == REFUSED_DIR:
            why = f"InfluxDB refused them; its reasons: {os.path.join(root, REASONS_FILE)}"
        else:
            why = "not delivered over HTTP at the time"
        notes.append(
            f"{count} sample(s) under {root} are not in InfluxDB ({why}); write them with "
            f"`dask-influx-metrics replay {os.fspath(folder)} --source URL`"
        )
    return notes


def missing_database(message: str, undelivered) -> str:
    """``message`` (a database or bucket not found), and where the samples are instead: the undelivered copy
    of an HTTP sink that could not write them there (``undelivered``: its spool folder), when it holds any.

    >>> missing_database("database 'x' not found", None)
    "database 'x' not found; an http sink creates a 1.x database when it first writes (influxdb.create-database); on 2.x map the database to a bucket (DBRP, deploy/README.md)"
    """
    pending = pending_notes(undelivered) if undelivered is not None else []
    if pending:
        return f"{message}; the samples are not lost: " + "; ".join(pending)
    return (
        f"{message}; an http sink creates a 1.x database when it first writes (influxdb.create-database); "
        "on 2.x map the database to a bucket (DBRP, deploy/README.md)"
    )


def kept_lines(folder, measurement: str, field: str) -> list[str]:
    """Where the lines of ``measurement``/``field`` that are not in InfluxDB are: one sentence per
    ``refused/`` or ``undelivered/`` folder under ``folder`` holding any (with InfluxDB's reason for a
    refusal). What a reader says instead of "no GPU" when a metric has no samples in InfluxDB.

    >>> kept_lines("/nonexistent", "gpu", "utilization_gpu")
    []
    """
    from ... import lineparse
    from ...sinks.paths import REFUSED_DIR, pending_folders
    from ...sinks.spool import read_lines

    out, head = [], measurement.encode() + b","
    for root in pending_folders(folder):
        count = 0
        for line in read_lines(root):
            if line.startswith(head) and field.encode() in line:
                try:
                    count += field in lineparse.parse(line).fields
                except ValueError:
                    continue
        if not count:
            continue
        what = f"{count} line(s) of {measurement}/{field}"
        if os.path.basename(root) == REFUSED_DIR:
            out.append(f"InfluxDB refused {what} ({_reason(root, measurement, field)}); they are kept in {root}")
        else:
            out.append(
                f"{what} are only in the undelivered copy at {root} (not delivered over HTTP at the time; write "
                f"them with `dask-influx-metrics replay {os.fspath(folder)} --source URL`)"
            )
    return out


def _reason(root: str, measurement: str, field: str) -> str:
    """InfluxDB's latest reason in ``root``'s reasons file that names the field (else its latest one)."""
    from ...sinks.paths import REASONS_FILE

    try:
        with open(os.path.join(root, REASONS_FILE), encoding="utf-8") as f:
            reasons = [line.strip().split(" ", 1)[-1] for line in f if line.strip()]
    except OSError:
        return f"no {REASONS_FILE} beside them"
    named = [r for r in reasons if f'"{field}"' in r and f'"{measurement}"' in r]
    return ((named or reasons or ["no reason recorded"])[-1])[:300]
