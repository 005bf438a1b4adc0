"""Per-worker tables: a Store's long samples -> one wide DataFrame per worker.

Each column is a **metric** (names: :mod:`dask_influx_metrics.client.query.metricnames`).
A per-worker **table** is a DataFrame indexed by ``time`` (UTC), with columns
``job`` and ``dag`` (the comma-joined tags), ``timestamp`` (seconds since
collection start, one clock for all workers), ``tasks`` and ``running`` when
collected, then one column per metric: ``<metric>[<i>]`` per GPU ``i`` for
device metrics, ``<metric>`` otherwise. ``table.attrs`` holds ``worker``,
``worker_index``, ``units`` and, read from a Store with GPU metrics, ``gpus``
(``{index: "host/uuid"}``: which physical GPU each device column is).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import pandas as pd

from .. import schema
from .query.metricnames import Metric, resolve
from .query.store import Store

DEVICE_COLUMN = re.compile(r"^(?P<metric>.+)\[(?P<index>\d+)\]$")
# Columns every table has, in this order, before the metrics.
BASE_COLUMNS = ("job", "dag", "timestamp")
TASK_COLUMNS = ("tasks", "running")
GPUS = "gpus"  # table.attrs: {device index: the physical GPU, "host/uuid"}


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


def worker_tables(
    store: Store,
    job: Optional[int] = None,
    metrics=None,
    workers=None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> dict[str, pd.DataFrame]:
    """``{address: table}`` of ``store``'s workers in index order (the columns: the module docstring).

    Only the fields behind ``metrics`` (default: all present) are read,
    one worker at a time, filtered by ``job`` on the server; host metrics
    are read once per host and joined by time (:mod:`dask_influx_metrics.client.hosts`).
    ``progress(done, total)`` is called after each worker.
    """
    chosen = store.select_workers(workers)
    job = store.check_job(job)
    metrics = store.resolve_metrics(metrics)
    fields = store.fields()
    wanted: dict[str, list[str]] = {}
    for m in metrics:
        wanted.setdefault(m.measurement, []).append(m.field)
    if schema.WORKER in fields:  # running tasks go in every table
        wanted.setdefault(schema.WORKER, [])
        wanted[schema.WORKER] += [f for f in ("tasks", "running") if f in fields[schema.WORKER]]
        if "tasks" in fields[schema.WORKER] and not any(m.name == "tasks" for m in metrics):
            metrics = metrics + resolve(["tasks"])
    origin = store.origin_ns
    hosts = store.host_longs([w for _, w in chosen], wanted[schema.HOST]) if schema.HOST in wanted else {}
    gpus = store.gpu_ids() if schema.GPU in wanted else {}

    def one(item):
        i, worker = item
        frames = {
            m: None if m == schema.HOST else store.backend.frame(m, list(dict.fromkeys(fs)), worker, job)
            for m, fs in wanted.items()
        }
        table = build(frames, metrics, origin, worker, i, host=hosts.get(worker))
        if worker in gpus:
            table.attrs[GPUS] = gpus[worker]
        return worker, table

    out = {}
    # A few workers in flight: the server builds one answer while we parse another.
    with ThreadPoolExecutor(max_workers=min(store.parallel, len(chosen))) as pool:
        for done, (worker, table) in enumerate(pool.map(one, chosen), 1):
            out[worker] = table
            if progress:
                progress(done, len(chosen))
    return out
