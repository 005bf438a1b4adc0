"""Per-worker tables: metric names -> fields, and long samples -> one wide DataFrame.

A **metric** is what a table column holds. Its name is one of:

- a tracking name with one numeric field (``compute-util``, ``mem-util``,
  ``total-mem``, ``tasks``, ``power``, ``host-cpu``, ...). ``total-mem`` and
  ``worker-gpu-mem`` are in **bytes**, as the old dask-metrics tool documented
  (InfluxDB holds MiB);
- ``measurement.field`` for any numeric field of the data contract
  (``host.memory_used``); tracking names with several fields (``host-mem``,
  ``disk-io``, ``net-io``, ``worker-mem``) expand to those;
- the name of a custom metric (``custom`` measurement).

A per-worker **table** is a DataFrame indexed by ``time`` (UTC), with columns
``job`` and ``dag`` (the comma-joined tags), ``timestamp`` (seconds since
collection start, one clock for all workers), ``tasks`` and ``running`` when
collected, then one column per metric: ``<metric>[<i>]`` per GPU ``i`` for
device metrics, ``<metric>`` otherwise. ``table.attrs`` holds ``worker``,
``worker_index``, ``units`` and, read from a Store with GPU metrics, ``gpus``
(``{index: "host/uuid"}``: which physical GPU each device column is).

>>> [m.name for m in resolve(["compute-util", "host-mem"])]
['compute-util', 'host.memory_used', 'host.memory_used_percent']
>>> resolve(["total-mem"])[0].scale
1048576.0
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

import pandas as pd

from .. import schema

MIB = float(2**20)
# Tracking names whose table values are bytes (the stored field is MiB).
BYTES_METRICS = ("total-mem", "worker-gpu-mem")
DEVICE_COLUMN = re.compile(r"^(?P<metric>.+)\[(?P<index>\d+)\]$")
# Columns every table has, in this order, before the metrics.
BASE_COLUMNS = ("job", "dag", "timestamp")
TASK_COLUMNS = ("tasks", "running")


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
            "the fullest filesystem per job and node in the summary's disk rows (db.summary()), every "
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


def _device_sort(values) -> list:
    return sorted(values, key=lambda v: (int(v) if str(v).isdigit() else 1 << 30, str(v)))


def _per_device(long: pd.DataFrame, field: str) -> bool:
    """Whether the rows holding ``field`` are device rows (each has an ``index``)."""
    if "index" not in long.columns:
        return False
    held = long[field].notna()
    return bool(long.loc[held if held.any() else slice(None), "index"].notna().all())


def build(
    frames: dict[str, pd.DataFrame],
    metrics: list[Metric],
    origin_ns: int,
    worker: str = "",
    worker_index: int = 0,
    host: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One worker's table from long frames (one per measurement).

    Each long frame has ``time`` (int ns), ``job``, ``dag``, the field columns
    and, for device points, ``index``. Samples of one instant share a time
    across measurements (the sampler stamps them together), so they join on it.
    ``host``: the long ``host`` frame of the worker's host (every writer's points,
    with ``worker``), joined by time instead (:func:`host_part`); its rows add no
    times and no job/dag tags to the table (``frames[HOST]`` is then a placeholder).
    """
    parts: list[pd.DataFrame] = []
    units: dict[str, str] = {}
    joined = {schema.HOST} if host is not None else set()
    tags = [
        long[["time", "job", "dag"]]
        for m, long in frames.items()
        if m not in joined and long is not None and not long.empty
    ]
    base = pd.concat(tags).drop_duplicates("time", keep="last").set_index("time").sort_index() if tags else None
    for measurement, long in frames.items():
        if measurement in joined:
            long = host
        if long is None or long.empty or base is None:
            continue
        wanted = [m for m in metrics if m.measurement == measurement and m.field in long.columns]
        for m in wanted:
            units[m.name] = m.unit
        if measurement in joined:
            parts.append(host_part(base.index, long, wanted, worker))
            continue
        if measurement == schema.WORKER and "running" in long.columns:
            parts.append(long.drop_duplicates("time", keep="last").set_index("time")[["running"]])
        # A custom measurement mixes per-device fields (rows with an index) and per-worker ones:
        # each metric is laid out by the rows that hold it.
        device = [m for m in wanted if _per_device(long, m.field)]
        if device:
            # a GPU's owner may write two points of one device at one instant (device-wide fields
            # tagged with every user's jobs, its own memory with its own): merge their fields
            values = (
                long.dropna(subset=["index"])
                .groupby(["time", "index"], sort=False, as_index=False)[[m.field for m in device]]
                .last()
            )
            values = values.assign(
                **{f"_{m.name}": pd.to_numeric(values[m.field], errors="coerce") * m.scale for m in device}
            )
            wide = values.pivot(index="time", columns="index", values=[f"_{m.name}" for m in device])
            order = _device_sort(wide.columns.get_level_values(1).unique())
            wide = wide.reindex(columns=pd.MultiIndex.from_product([[f"_{m.name}" for m in device], order]))
            wide.columns = [f"{name[1:]}[{i}]" for name, i in wide.columns]
            parts.append(wide.dropna(axis=1, how="all"))
        plain = [m for m in wanted if m not in device]
        if plain:
            parts.append(_plain(long, plain))
    if base is None:
        table = pd.DataFrame(columns=list(BASE_COLUMNS))
        table.index = pd.DatetimeIndex([], tz="UTC", name="time")
    else:
        table = base.join(parts, how="left") if parts else base
        table = table.astype({"job": str, "dag": str})
        table.insert(2, "timestamp", (table.index.to_numpy(dtype="int64") - int(origin_ns)) / 1e9)
        table.index = pd.to_datetime(table.index, unit="ns", utc=True).rename("time")
    order = [c for c in BASE_COLUMNS + TASK_COLUMNS if c in table.columns]
    table = table[order + [c for c in table.columns if c not in order]]
    table.attrs = {"worker": worker, "worker_index": worker_index, "units": units}
    return table


def _plain(long: pd.DataFrame, plain: list[Metric]) -> pd.DataFrame:
    """Columns of non-device metrics, indexed by time (the last point of an instant wins)."""
    values = long.dropna(subset=[m.field for m in plain], how="all")
    values = values.drop_duplicates("time", keep="last").set_index("time")
    return pd.DataFrame({m.name: values[m.field] * m.scale if m.scale != 1 else values[m.field] for m in plain})


# A worker's row gets the host reading taken at or before it, at most this many of the host's
# sampling intervals earlier (the interval: the median step between one writer's host points).
HOST_TOLERANCE_INTERVALS = 3
HOST_TOLERANCE_DEFAULT_NS = 1_000_000_000  # when the host has fewer than two points


def host_step_ns(host: pd.DataFrame) -> int | None:
    """The host series' sampling interval (ns): the median step between consecutive points of each
    writer (``worker``), the median over writers; None with fewer than two points per writer."""
    times = host.sort_values("time", kind="stable")
    writer = times["worker"].fillna("") if "worker" in times else pd.Series("", index=times.index)
    steps = times.groupby(writer)["time"].diff().dropna()
    steps = steps[steps > 0]
    return int(steps.median()) if len(steps) else None


def host_part(times: pd.Index, host: pd.DataFrame, metrics: list[Metric], worker: str) -> pd.DataFrame:
    """Host metric columns for a worker's rows at ``times`` (int ns, sorted): for each row, the last
    reading of its host at or before it (an as-of join), at most :data:`HOST_TOLERANCE_INTERVALS`
    host intervals earlier, else NaN. At one instant the worker's own point wins (data in which
    every worker wrote its host readings, before ``sampler.host-once``: each row keeps its own)."""
    fields = [m.field for m in metrics]
    right = host.dropna(subset=fields, how="all")
    own = (right["worker"] == worker) if "worker" in right.columns else False
    right = right.assign(_own=own).sort_values(["time", "_own"], kind="stable")
    right = pd.DataFrame(
        {
            "time": right["time"].astype("int64"),
            **{m.name: pd.to_numeric(right[m.field], errors="coerce") * m.scale for m in metrics},
        }
    )
    step = host_step_ns(host)
    tolerance = HOST_TOLERANCE_INTERVALS * step if step else HOST_TOLERANCE_DEFAULT_NS
    left = pd.DataFrame({"time": pd.Index(times).astype("int64")})
    joined = pd.merge_asof(left, right, on="time", direction="backward", tolerance=int(tolerance))
    return joined.set_index(pd.Index(times, name="time"))[[m.name for m in metrics]]


def device_columns(table: pd.DataFrame, metric: str) -> list[str]:
    """The columns of ``metric`` in ``table``: ``[metric]`` or ``metric[0], metric[1], ...``.

    >>> device_columns(pd.DataFrame(columns=["job", "x[0]", "x[1]"]), "x")
    ['x[0]', 'x[1]']
    """
    if metric in table.columns:
        return [metric]
    cols = [(int(m["index"]), c) for c in table.columns if (m := DEVICE_COLUMN.match(str(c))) and m["metric"] == metric]
    return [c for _, c in sorted(cols)]


def table_metrics(table: pd.DataFrame) -> list[str]:
    """Metric names present in ``table``, in column order.

    >>> table_metrics(pd.DataFrame(columns=["job", "dag", "timestamp", "x[0]", "x[1]", "tasks"]))
    ['x', 'tasks']
    """
    out: list[str] = []
    for c in table.columns:
        if c in BASE_COLUMNS or c == "running":
            continue
        m = DEVICE_COLUMN.match(str(c))
        name = m["metric"] if m else str(c)
        if name not in out:
            out.append(name)
    return out


def not_recorded(what: str, names, otherwise: str) -> str:
    """Why a reader found no ``what``, with the tracking names that record it: the one wording of
    every empty answer (``frame.attrs["why"]``), so the CLI's errors and the report's empty sections
    agree. An unknown name raises (as :func:`fields_for`): the hint stays true.

    >>> not_recorded("task stream", ["task-stream"], "no task finished in range")
    'no task stream recorded: add `task-stream` to tracking (or tracking=None: every metric), or no task finished in range'
    >>> not_recorded("X", ["compute-util", "gpm", "worker-gpu-mem"], "no GPU").split(" to ")[0]
    'no X recorded: add `compute-util`, `gpm` or `worker-gpu-mem`'
    """
    names = list(names)
    schema.fields_for(names)
    quoted = [f"`{n}`" for n in names]
    listed = ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]
    return f"no {what} recorded: add {listed} to tracking (or tracking=None: every metric), or {otherwise}"
