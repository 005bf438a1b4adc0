"""What every query backend shares: the error type and the shape of a long frame.

A backend (``influxql.py``, ``flux.py``, ``spool.py``) is a :class:`Backend`:
it answers ``fields()``, ``tag_values(key)``, ``first_time()``, ``last_time()``,
``frame(measurement, fields, worker, job, host=None)`` (long samples: ``time`` in ns,
``job``, ``dag``, ``index`` for device points, one column per field; with
``host`` and ``worker=None``, every worker's points of that host and their
``worker``: how the one ``host`` series of a host is read),
``max_by(measurement, field, by, workers, job, busy)`` (``busy``: samples
with ``dag != "0"`` only), ``dag_points()`` and ``points(measurement, columns)``
(every point: ``time`` and the named tags or fields, e.g. ``task`` points), all within its time range
(``start_ns``, ``stop_ns``) and ``tags``; ``describe()`` names what it reads,
``notes`` lists what its answers should be read with (skipped lines,
undelivered samples), ``widened()`` is the same source without range and
tags, and ``close()`` releases its connections. Everything else is built on those in
:mod:`dask_influx_metrics.query`.

>>> list(empty_frame(["utilization_gpu"], device=True).columns)
['time', 'job', 'dag', 'index', 'utilization_gpu']
"""

from __future__ import annotations

import copy
import os
from typing import Optional, Protocol

import pandas as pd

from ... import schema

# Measurements that hold worker samples, and those whose points carry device tags.
SAMPLE_MEASUREMENTS = (schema.GPU, schema.HOST, schema.WORKER, schema.CUSTOM)
DEVICE_MEASUREMENTS = (schema.GPU, schema.CUSTOM)


class Backend(Protocol):
    """What :class:`~dask_influx_metrics.query.Store` asks of a backend."""

    language: str
    tags: dict
    start_ns: Optional[int]
    stop_ns: Optional[int]
    notes: list[str]

    def describe(self) -> str: ...
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
    def close(self) -> None: ...


class QueryError(RuntimeError):
    """A question the data cannot answer: unreachable server, unknown database, bad name."""


# Tags read as strings, never numbers ("1,2" or "01" must survive).
TAG_DTYPES = {"job": str, "dag": str, "index": str, "worker": str, "host": str, "uuid": str, "name": str}


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
