"""Metric names: what a column of a worker's table holds, and which stored field it reads.

A **metric** name is one of:

- a tracking name with one numeric field (``compute-util``, ``mem-util``,
  ``total-mem``, ``tasks``, ``power``, ``host-cpu``, ...). ``total-mem`` and
  ``worker-gpu-mem`` are in **bytes**, as the old dask-metrics tool documented
  (InfluxDB holds MiB);
- ``measurement.field`` for any numeric field of the data contract
  (``host.memory_used``); tracking names with several fields (``host-mem``,
  ``disk-io``, ``net-io``, ``worker-mem``) expand to those;
- the name of a custom metric (``custom`` measurement).

The :class:`~.store.Store` resolves names to fields to read them; the tables built from them are
:mod:`dask_influx_metrics.client.tables`.

>>> [m.name for m in resolve(["compute-util", "host-mem"])]
['compute-util', 'host.memory_used', 'host.memory_used_percent']
>>> resolve(["total-mem"])[0].scale
1048576.0
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

from ... import schema

MIB = float(2**20)
# Tracking names whose table values are bytes (the stored field is MiB).
BYTES_METRICS = ("total-mem", "worker-gpu-mem")


class Metric(NamedTuple):
    name: str
    measurement: str
    field: str
    unit: str
    scale: float = 1.0  # stored value x scale = table value


def _numeric(measurement: str, field: str) -> bool:
    f = schema.FIELDS.get((measurement, field))
    return f is not None and f.type is not str


def _field_metric(measurement: str, field: str) -> Metric:
    f = schema.FIELDS[measurement, field]
    return Metric(f"{measurement}.{field}", measurement, field, f.unit)


def _tracking_metrics(name: str) -> list[Metric]:
    pairs = [p for p in schema.TRACKING[name] if _numeric(*p)]
    if len(pairs) == 1:
        ((m, f),) = pairs
        if name in BYTES_METRICS:
            return [Metric(name, m, f, "bytes", MIB)]
        return [Metric(name, m, f, schema.FIELDS[m, f].unit)]
    return [_field_metric(m, f) for m, f in pairs]


def _named(name: str, custom: list) -> list[Metric] | None:
    """The metrics one name stands for, or None when it names nothing."""
    if name in schema.TRACKING:
        return _tracking_metrics(name)
    if "." in name and _numeric(*name.split(".", 1)) and not name.startswith(schema.DAG + "."):
        return [_field_metric(*name.split(".", 1))]
    if name in custom or (name.startswith("custom.") and name[7:] in custom):
        field = name[7:] if name.startswith("custom.") and name not in custom else name
        return [Metric(field, schema.CUSTOM, field, "")]
    return None


def unknown(names: Iterable[str], custom: Iterable[str] = ()) -> list[str]:
    """The names that are no tracking name, ``measurement.field`` or custom metric in ``custom``.

    >>> unknown(["power", "gpu-magic", "x"], custom=["x"])
    ['gpu-magic']
    """
    custom = list(custom)
    return [n for n in names if _named(n, custom) is None]


def resolve(names: Iterable[str], custom: Iterable[str] = ()) -> list[Metric]:
    """Metric names -> :class:`Metric` list; unknown names raise, listing the known ones.

    ``custom`` are the custom metric names that exist in the data.

    >>> resolve(["power"])
    [Metric(name='power', measurement='gpu', field='power_draw', unit='W', scale=1.0)]
    """
    names, custom = list(names), list(custom)
    out: list[Metric] = []
    for name in names:
        out.extend(_named(name, custom) or [])
    missing = unknown(names, custom)
    if missing:
        known = sorted(schema.TRACKING) + sorted(
            f"{m}.{f}" for m, f in schema.FIELDS if _numeric(m, f) and m not in (schema.DAG, schema.DISK)
        )
        raise ValueError(
            f"unknown metric(s) {missing}; known: {known}"
            + (f"; custom metrics in this data: {sorted(custom)}" if custom else "")
        )
    per_path = [m.name for m in out if m.measurement == schema.DISK]
    if per_path:  # one series per filesystem: no column of a worker's table
        raise ValueError(
            f"{per_path}: the disk measurement holds one series per filesystem, not a table column; read "
            "the fullest filesystem per job and node in the summary's disk rows (query.summary(db)), every "
            "reading with db.disk_points()"
        )
    seen: dict[str, Metric] = {}
    for m in out:
        seen.setdefault(m.name, m)
    return list(seen.values())


def default_metrics(available: dict[str, list[str]]) -> list[Metric]:
    """Every numeric field present in ``available`` ({measurement: [fields]}), by its best name.

    Static capacities (``memory_total``) are left out; ask for them by name.

    >>> [m.name for m in default_metrics({"gpu": ["utilization_gpu", "memory_total"], "custom": ["x"]})]
    ['compute-util', 'x']
    """
    out, seen = [], set()
    for name in schema.TRACKING:
        for m in _tracking_metrics(name):  # a field by its first name (accounting lists the fields it reads)
            if m.field in available.get(m.measurement, ()) and (m.measurement, m.field) not in seen:
                seen.add((m.measurement, m.field))
                out.append(m)
    out.extend(Metric(f, schema.CUSTOM, f, "") for f in sorted(available.get(schema.CUSTOM, ())))
    return out


def natural_key(text: str):
    """Sort key that orders digit runs as numbers: worker 10.0.0.9 before 10.0.0.10.

    >>> sorted(["tcp://h:10", "tcp://h:9"], key=natural_key)
    ['tcp://h:9', 'tcp://h:10']
    """
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text) if t]
