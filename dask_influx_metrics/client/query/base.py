"""What every query backend shares: the error type and the shape of a long frame.

A backend (``influxql.py``, ``flux.py``, ``spool.py``) answers five questions:
``fields()``, ``tag_values(key)``, ``first_time()``, ``frame(measurement,
fields, worker, job)`` (long samples: ``time`` in ns, ``job``, ``dag``,
``index`` for device points, one column per field), ``max_by(measurement,
field, by, workers, job)`` and ``dag_points()``. Everything else is built on
those in :mod:`dask_influx_metrics.query`.

>>> list(empty_frame(["utilization_gpu"], device=True).columns)
['time', 'job', 'dag', 'index', 'utilization_gpu']
"""

from __future__ import annotations

import pandas as pd

from ... import schema

# Measurements that hold worker samples, and those whose points carry device tags.
SAMPLE_MEASUREMENTS = (schema.GPU, schema.HOST, schema.WORKER, schema.CUSTOM)
DEVICE_MEASUREMENTS = (schema.GPU, schema.CUSTOM)


class QueryError(RuntimeError):
    """A question the data cannot answer: unreachable server, unknown database, bad name."""


# Tags read as strings, never numbers ("1,2" or "01" must survive).
TAG_DTYPES = {"job": str, "dag": str, "index": str, "worker": str, "host": str, "uuid": str, "name": str}


def empty_frame(fields, device: bool) -> pd.DataFrame:
    return pd.DataFrame(columns=["time", "job", "dag"] + (["index"] if device else []) + list(fields))
