"""Utilization summaries: the figures an operator uses to find wasted GPUs, and each node's resources.

One row per worker, job and resource (``gpu``: all GPUs of the worker pooled,
``cpu``: the host's CPU): ``samples``, ``devices``, ``hours`` (wall time the
samples cover), ``mean`` and ``max`` utilization (%),
``above_20``/``above_40``/``above_80`` and ``at_100`` (share of the time, 0-1),
``device_hours`` (the device time the samples cover), ``unused_device_hours``
(device_hours x (1 - mean / 100)) and ``held_idle_device_hours``.

**Node resources** (the host's, as the ``cpu`` rows; ``host`` names the node): ``cpu``
rows also hold ``core_max`` and ``core_min``, the highest reading of the busiest
and of the idlest core (% of one core: one core pinned while the rest idle reads
``core_max`` 100 and ``mean`` 100 / cores), and count cores (``devices``: the
host's logical CPUs, so ``device_hours`` are CPU core-hours; NaN for data
without ``cpu_count``); ``memory`` rows the host memory in use (``mean``,
``max``, shares of the time above 20/40/80 % and at 100 %); ``disk`` rows the
fullest of the workers' filesystems (``mean``, ``max`` % in use) and
``read_bytes``/``write_bytes``; ``network`` rows ``lo_sent_bytes``,
``lo_recv_bytes`` (loopback interfaces), ``ext_sent_bytes``, ``ext_recv_bytes``
(the others). Bytes are the counters' increase over the windows the rows cover
(:func:`deltas`: each reading's window, as the time weights below; a counter that
went back, a reboot or a device gone, leaves its window out, said in
``frame.attrs["notes"]``). Columns a resource has no figure for are NaN.

**Time-weighted** (:func:`weights`): samples are not evenly spaced (the sampler
also wakes at task starts, so a short-task workload puts most samples where
tasks start), so each value counts for the time it stands for: the window that
ends at it, from the previous value of the same GPU (or host), as NVML's
utilization and the host's CPU share are averages over the time before a read;
at most :data:`CAP_INTERVALS` regular sampling steps (a gap, e.g. a stopped
sampler, is not charged to the value after it); the first value stands for one
sampling interval. Means, shares, hours and device-hours all use these weights;
``samples`` counts samples.

**Held but idle** (``held_idle_device_hours``, gpu rows): device-hours in
which the worker holds GPU memory while the GPU computes nothing: the time of
each (sample, GPU) value where ``compute-util`` is 0 and the worker holds memory
on that GPU: ``worker-gpu-mem`` > 0 (the worker's own process tree), or, in a
sample without that field, ``total-mem`` > 0 (the whole device). NaN when
neither memory metric was collected, and on cpu rows.

**Host CPU** (cpu rows): with ``hosts`` (``{worker: its host's table}``,
:func:`.hosts.host_tables_by_worker`) a worker's cpu
rows are its host's: the host series with its own ``job``/``dag`` tags (the
jobs of every worker of the host), so every worker of a host shows the same
cpu figures, and a job's cpu rows cover the samples at which it ran anywhere on
the host. Without ``hosts``, from the worker's own table (its own tags).

Rows with ``job`` ``<NA>`` cover the whole session, every sample. The others
cover the samples that count for that job: busy (``dag != "0"``) with the job
in the ``job`` tag (shared samples count for each job in their tag); idle
samples count for no job.

**Each physical GPU once** (gpu rows with ``worker_index`` <NA>, ``worker``
:data:`ALL`): a worker's rows hold every GPU it uses, so on a GPU several workers
share each worker's rows count the whole device (their own view). These rows add
the workers up counting each physical GPU (``table.attrs["gpus"]``: device index
-> ``host/uuid``) once: the time of a GPU's values is the union of the windows
of every worker's values of it (per job: of those that count for the job), so
``device_hours`` is the wall time x the GPUs, ``devices`` the physical GPUs, and
``held_idle_device_hours`` the time in which any of its workers held memory on
it while it computed nothing. Only where every table says which GPU each column is.

>>> import pandas as pd
>>> t = pd.DataFrame({"job": ["1"] * 4, "dag": ["1"] * 3 + ["0"], "timestamp": [0.0, 0.5, 1.0, 1.5],
...                   "compute-util[0]": [0.0, 50.0, 100.0, 100.0], "total-mem[0]": [1e9, 1e9, 1e9, 0.0],
...                   "host-cpu": [10.0] * 4})
>>> t.attrs = {"worker": "tcp://a:1", "worker_index": 0}
>>> s = summarize([t], per_job=False)
>>> s[["resource", "mean", "at_100", "device_hours"]].to_dict("records")[1]
{'resource': 'gpu', 'mean': 62.5, 'at_100': 0.5, 'device_hours': 0.0005555555555555556}
>>> job = summarize([t])
>>> gpu = job[(job["job"] == 1) & (job["resource"] == "gpu")]
>>> gpu[["samples", "mean", "held_idle_device_hours"]].to_dict("records")
[{'samples': 3, 'mean': 50.0, 'held_idle_device_hours': 0.0001388888888888889}]
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from .. import jobtags, schema
from .hosts import host_tables_by_worker
from .query.metricnames import Metric
from .query.store import Store
from .tables import DEVICE_COLUMN, GPUS, device_columns, host_part, worker_tables

GPU_METRIC = "compute-util"
ALL = "all workers"  # the worker of the rows that count each physical GPU once
CPU_METRIC = "host-cpu"
# The host columns the node rows read (table metric names), besides CPU_METRIC.
CORE_MAX, CORE_MIN, CORES = (f"host.{f}" for f in ("cpu_percent_core_max", "cpu_percent_core_min", "cpu_count"))
MEMORY_METRIC = "host.memory_used_percent"
DISK_USAGE = "disk.used_percent"  # a host table's column: the fullest filesystem's at each host reading
COUNTERS = {  # resource -> {summary column: the host counter it is the increase of}
    "disk": {"read_bytes": "host.disk_read_bytes", "write_bytes": "host.disk_write_bytes"},
    "network": {f"{k}_{d}_bytes": f"host.net_{d}_{k}_bytes" for k in ("lo", "ext") for d in ("sent", "recv")},
}
HOST_METRICS = (
    CPU_METRIC,
    CORE_MAX,
    CORE_MIN,
    CORES,
    MEMORY_METRIC,
    *(c for cs in COUNTERS.values() for c in cs.values()),
)
# Held GPU memory: the worker's own first, the whole device's where a sample lacks it.
MEMORY_METRICS = ("worker-gpu-mem", "total-mem")
THRESHOLDS = (20, 40, 80)
# A value stands for the window before it (from the previous one), at most this many regular sampling steps.
CAP_INTERVALS = 3
# The regular step: this quantile of the steps (wake samples at task starts make many steps short).
REGULAR_STEP_QUANTILE = 0.95
COLUMNS = [
    "worker_index",
    "worker",
    "job",
    "resource",
    "samples",
    "devices",
    "hours",
    "mean",
    "max",
    *[f"above_{t}" for t in THRESHOLDS],
    "at_100",
    "device_hours",
    "unused_device_hours",
    "held_idle_device_hours",
    "core_max",
    "core_min",
    *COUNTERS["disk"],
    *COUNTERS["network"],
    "host",
]
NODE_ONLY = ("device_hours", "unused_device_hours", "held_idle_device_hours")  # NaN on memory, disk, network rows


def interval_seconds(table: pd.DataFrame) -> float:
    """The sampling interval: ``attrs["interval"]`` when set (host tables), else the median step
    between consecutive timestamps (0 if < 2 rows)."""
    if table.attrs.get("interval") is not None:
        return float(table.attrs["interval"])
    steps = np.diff(table["timestamp"].to_numpy(dtype=float))
    steps = steps[steps > 0]
    return float(np.median(steps)) if len(steps) else 0.0


def weights(seconds: np.ndarray, values: np.ndarray, first: float | None = None) -> np.ndarray:
    """Seconds each of ``values`` (samples x devices, at sample times ``seconds``, sorted) stands for:
    the window that ends at it, from the previous non-NaN value of the same device, at most
    :data:`CAP_INTERVALS` regular steps (a high quantile of that device's steps: wake samples make many
    steps short); the first value ``first`` (the sampling interval, :func:`interval_seconds`; default:
    the median step); NaN values 0.

    >>> t = np.append(np.arange(60) * 0.1, 60.0)  # every 0.1 s, then a minute's gap
    >>> values = np.ones((61, 1)); values[1] = np.nan
    >>> weights(t, values, first=0.1)[[0, 1, 2, 59, 60], 0].round(2)  # first, NaN, from the one before, -, capped
    array([0.1, 0. , 0.2, 0.1, 0.3])
    """
    out = np.zeros(values.shape)
    for d in range(values.shape[1]):
        valid = np.flatnonzero(~np.isnan(values[:, d]))
        if not len(valid):
            continue
        steps = np.diff(seconds[valid])
        positive = steps[steps > 0]
        start = first if first is not None else float(np.median(positive)) if len(positive) else 0.0
        regular = np.quantile(positive, REGULAR_STEP_QUANTILE) if len(positive) else start
        out[valid, d] = np.minimum(np.insert(steps, 0, start), CAP_INTERVALS * regular)
    return out


def held_memory(table: pd.DataFrame, util_columns: list[str]):
    """Per sample and GPU of ``util_columns``: 1.0 where the worker holds GPU memory, 0.0 where not, NaN unknown.

    ``worker-gpu-mem[i] > 0`` where that value exists, else ``total-mem[i] > 0``;
    None when the table has neither metric.
    """
    names = [[m + column[len(GPU_METRIC) :] for m in MEMORY_METRICS] for column in util_columns]
    if not any(n in table.columns for pair in names for n in pair):
        return None
    nan = np.full(len(table), np.nan)
    held = []
    for pair in names:
        own, whole = (table[n].to_numpy(dtype=float) if n in table.columns else nan for n in pair)
        held.append(np.where(np.isnan(own), np.where(np.isnan(whole), np.nan, whole > 0), own > 0))
    return np.column_stack(held)


def _row(util: np.ndarray, held, seconds: np.ndarray) -> dict:
    """Figures of ``util`` (samples x devices), ``held`` (same shape, or None) and the seconds each
    value stands for (same shape, :func:`weights`)."""
    devices = util.shape[1]
    valid = ~np.isnan(util)
    values, time = util[valid], seconds[valid]
    total = float(time.sum())
    known = len(values) > 0 and total > 0

    def share(mask) -> float:
        return float(time[mask].sum() / total) if known else float("nan")

    mean = float((values * time).sum() / total) if known else float("nan")
    row = {
        "samples": len(values) // max(devices, 1),
        "devices": devices,
        "hours": float(seconds.max(axis=1, initial=0).sum()) / 3600 if len(util) else 0.0,
        "mean": mean,
        "max": float(values.max()) if len(values) else float("nan"),
    }
    for t in THRESHOLDS:
        row[f"above_{t}"] = share(values > t)
    row["at_100"] = share(values >= 100)
    row["device_hours"] = total / 3600
    row["unused_device_hours"] = float((time * (1 - values / 100)).sum()) / 3600 if known else 0.0
    row["held_idle_device_hours"] = (
        float(seconds[(held == 1) & (util == 0)].sum()) / 3600 if held is not None else float("nan")
    )
    return row


def _union(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For intervals sorted by ``start``: the part of each that no interval before it covers (they add up
    to the length of their union).

    >>> _union(np.array([0.0, 0.5, 3.0]), np.array([1.0, 2.0, 4.0])).tolist()
    [1.0, 1.0, 1.0]
    """
    before = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
    return np.clip(end - np.maximum(start, before), 0.0, None)


def _spans(table: pd.DataFrame, cols: list[str], seconds: np.ndarray, held) -> pd.DataFrame | None:
    """One row per GPU value of a worker's table: ``gpu`` (the physical GPU), its window ``start``-``end``
    (s), ``util``, ``held``, and the row's ``job`` and ``counts`` (it counts for the jobs in its tag);
    None when the table does not say which GPU a column is."""
    ids = table.attrs.get(GPUS) or {}
    index = [DEVICE_COLUMN.match(c)["index"] if DEVICE_COLUMN.match(c) else None for c in cols]
    if not all(i in ids for i in index):
        return None
    end, util = table["timestamp"].to_numpy(dtype=float), table[cols].to_numpy(dtype=float)
    held = np.full(util.shape, np.nan) if held is None else held
    counts = jobtags.counting(table).to_numpy()
    parts = [
        pd.DataFrame(
            {"gpu": ids[i], "start": end - seconds[:, d], "end": end, "util": util[:, d], "held": held[:, d]}
        ).assign(job=table["job"].astype(str).to_numpy(), counts=counts)
        for d, i in enumerate(index)
    ]
    out = pd.concat(parts, ignore_index=True)
    return out[out["util"].notna()]


def _once(spans: pd.DataFrame) -> dict:
    """The figures of :func:`_row` for ``spans`` (:func:`_spans` of every worker), each physical GPU once."""
    spans = spans.sort_values(["gpu", "start"], kind="stable")
    time = np.concatenate([_union(g["start"].to_numpy(), g["end"].to_numpy()) for _, g in spans.groupby("gpu")])
    row = _row(spans["util"].to_numpy()[:, None], None, time[:, None])
    held = spans[(spans["held"] == 1) & (spans["util"] == 0)]
    idle = sum(_union(g["start"].to_numpy(), g["end"].to_numpy()).sum() for _, g in held.groupby("gpu"))
    wall = spans.sort_values("start", kind="stable")
    row.update(
        samples=int((time > 0).sum()),
        devices=spans["gpu"].nunique(),
        hours=float(_union(wall["start"].to_numpy(), wall["end"].to_numpy()).sum()) / 3600,
        held_idle_device_hours=float(idle) / 3600 if spans["held"].notna().any() else float("nan"),
    )
    return row


def summarize(tables: list[pd.DataFrame], per_job: bool = True, hosts: dict | None = None) -> pd.DataFrame:
    """Utilization summary rows for ``tables`` (whole session, and per job when ``per_job``);
    ``hosts``: ``{worker: host table}``, where the cpu and other node rows come from (see the module docstring)."""
    rows, spans, notes = [], [], []
    for own in tables:
        who = {"worker_index": own.attrs.get("worker_index", 0), "worker": own.attrs.get("worker", "")}
        node = hosts.get(who["worker"]) if hosts is not None else None
        who["host"] = node.attrs.get("host", pd.NA) if node is not None else pd.NA
        for resource, metric in (("gpu", GPU_METRIC), ("cpu", CPU_METRIC)):
            table = own if hosts is None or resource == "gpu" else node
            if table is None:
                continue
            jobs = jobtags.distinct(table.loc[jobtags.counting(table), "job"].unique()) if per_job else []
            cols = device_columns(table, metric)
            if not cols:
                continue
            util = table[cols].to_numpy(dtype=float)
            seconds = weights(table["timestamp"].to_numpy(dtype=float), util, first=interval_seconds(table))
            held = held_memory(table, cols) if resource == "gpu" else None
            if resource == "gpu":
                spans.append(_spans(table, cols, seconds, held))
            extra = _cores if resource == "cpu" else lambda table, mask, row: row
            rows.append({**who, "job": pd.NA, "resource": resource, **extra(table, None, _row(util, held, seconds))})
            for job in jobs:
                mask = jobtags.counts_for(table, job).to_numpy()
                row = _row(util[mask], None if held is None else held[mask], seconds[mask])
                rows.append({**who, "job": job, "resource": resource, **extra(table, mask, row)})
        if node is not None:
            rows += _node_rows(node, who, per_job, notes)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["job"] = frame["job"].astype("Int64")
    frame = frame.sort_values(["worker_index", "resource", "job"], na_position="first", kind="stable")
    if spans and all(s is not None for s in spans):
        frame = pd.concat([frame, _all_workers(pd.concat(spans, ignore_index=True), per_job)], ignore_index=True)
    frame = frame.reset_index(drop=True).astype({"devices": "Int64"})
    frame.attrs["notes"] = list(dict.fromkeys(notes))
    return frame


def _cores(table: pd.DataFrame, mask, row: dict) -> dict:
    """A cpu ``row`` with the core spread (the highest per-sample reading of the busiest and the idlest core)
    and the cores: ``devices`` = the host's logical CPUs, ``device_hours`` CPU core-hours (NaN: not recorded)."""
    part = table if mask is None else table[mask]
    spread = {
        c: part[m].max() if m in part.columns else np.nan for c, m in (("core_max", CORE_MAX), ("core_min", CORE_MIN))
    }
    cores = float(table[CORES].max()) if CORES in table.columns else np.nan
    return {
        **row,
        **{k: float(v) for k, v in spread.items()},
        "devices": cores,
        "device_hours": row["device_hours"] * cores,
        "unused_device_hours": row["unused_device_hours"] * cores,
    }


def deltas(table: pd.DataFrame, column: str) -> tuple[np.ndarray, int]:
    """The increase of counter ``column`` over the window of each row (from the previous reading), and how many
    times it went back (a reboot, a device or interface gone, a wrap: that window is left out, NaN). As the
    time weights (:func:`weights`): a window longer than :data:`CAP_INTERVALS` regular steps (a gap) counts
    the capped share of its increase; the first reading has no window (NaN).

    >>> t = pd.DataFrame({"timestamp": np.append(np.arange(30.0), 59.0), "c": np.append(np.arange(30.0), 59.0) * 10})
    >>> t.loc[10, "c"] = 5.0  # it went back: that window is left out, the next counts from it
    >>> d, back = deltas(t, "c"); d[[0, 1, 10, 11, 30]].tolist(), back  # the 30 s gap counts 3 s of its 300
    ([nan, 10.0, nan, 105.0, 30.0], 1)
    """
    values = table[column].to_numpy(dtype=float)
    seconds = table["timestamp"].to_numpy(dtype=float)
    out = np.full(len(values), np.nan)
    valid = np.flatnonzero(~np.isnan(values))
    if len(valid) < 2:
        return out, 0
    weight = weights(seconds, values[:, None], first=interval_seconds(table))[valid[1:], 0]
    steps, rise = np.diff(seconds[valid]), np.diff(values[valid])
    share = np.where(steps > 0, np.minimum(1.0, weight / np.where(steps > 0, steps, 1.0)), 1.0)
    out[valid[1:]] = np.where(rise >= 0, rise * share, np.nan)
    return out, int((rise < 0).sum())


def _node_rows(table: pd.DataFrame, who: dict, per_job: bool, notes: list) -> list[dict]:
    """The memory, disk and network rows of a worker's node (its host table), whole session then per job."""
    jobs = jobtags.distinct(table.loc[jobtags.counting(table), "job"].unique()) if per_job else []
    masks = [(pd.NA, slice(None))] + [(job, jobtags.counts_for(table, job).to_numpy()) for job in jobs]
    seconds, first = table["timestamp"].to_numpy(dtype=float), interval_seconds(table)
    rows = []
    for resource, level in (("memory", MEMORY_METRIC), ("disk", DISK_USAGE), ("network", None)):
        counters = {n: c for n, c in COUNTERS.get(resource, {}).items() if c in table.columns}
        timed = level if level in table.columns else next(iter(counters.values()), None)
        if timed is None:
            continue
        values = table[timed].to_numpy(dtype=float)[:, None]
        time = weights(seconds, values, first=first)
        increase, went_back = {}, []
        for name, column in counters.items():
            increase[name], back = deltas(table, column)
            went_back += [f"{column} {back}x"] if back else []
        if went_back:
            notes.append(
                f"host {table.attrs.get('host', '?')}: counters went back (a reboot, a device or interface gone, a "
                f"wrap): {', '.join(went_back)}; those windows are left out of the {resource} totals"
            )
        for job, mask in masks:
            row = _row(values[mask], None, time[mask])
            if timed != level:  # counters only: no level to average
                row.update({k: float("nan") for k in ("mean", "max", *[f"above_{t}" for t in THRESHOLDS], "at_100")})
            row.update({k: float("nan") for k in ("devices", *NODE_ONLY)})
            row.update({n: float(np.nansum(d[mask])) for n, d in increase.items()})
            rows.append({**who, "job": job, "resource": resource, **row})
    return rows


def _all_workers(spans: pd.DataFrame, per_job: bool) -> pd.DataFrame:
    """The gpu rows that count each physical GPU once: the whole session, then each job."""
    who = {"worker_index": pd.NA, "worker": ALL, "resource": "gpu"}
    rows = [{**who, "job": pd.NA, **_once(spans)}] if len(spans) else []
    counted = spans[spans["counts"]]
    for job in jobtags.distinct(counted["job"].unique()) if per_job else []:
        rows.append({**who, "job": job, **_once(counted[jobtags.series_contains(counted["job"], job)])})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.astype({"job": "Int64", "worker_index": "Int64"})


def summary(store: Store, per_job: bool = True, workers=None, job: Optional[int] = None) -> pd.DataFrame:
    """GPU utilization per worker of ``store`` and its node's CPU, memory, disk and network (and per job):
    :func:`summarize` of its tables; the node rows of a worker are its host's (:func:`node_tables`).
    With ``job``: that job's rows only (``per_job`` then does not matter)."""
    present = store.metrics()
    names = [n for n in (GPU_METRIC, *MEMORY_METRICS) if n in present]
    nodes = [n for n in HOST_METRICS if n in present]
    if GPU_METRIC not in names and not nodes:
        raise ValueError(f"a summary needs compute-util or a host metric (host-cpu, host-mem, ...); present: {present}")
    tables = worker_tables(store, job=job, metrics=names or nodes[:1], workers=workers)
    hosts = node_tables(store, list(tables)) if nodes else None
    frame = summarize(list(tables.values()), per_job=per_job or job is not None, hosts=hosts)
    for note in frame.attrs.get("notes", []):
        store.skip_note(note)
    return frame if job is None else frame[frame["job"] == job].reset_index(drop=True)


def node_tables(store: Store, workers) -> dict[str, pd.DataFrame] | None:
    """``{worker: its host's table}`` (:func:`.hosts.host_tables`) of what the node rows read: the host
    metrics of :data:`HOST_METRICS` present and, column :data:`DISK_USAGE`, the fullest of the workers'
    filesystems at each host reading; None when the workers recorded no host metric."""
    names = [n for n in HOST_METRICS if n in store.metrics()]
    if not names:
        return None
    tables = host_tables_by_worker(store, workers, names)
    disks = store.disk_points()
    for table in {id(t): t for t in tables.values()}.values():
        mine = disks[disks["host"] == table.attrs["host"]] if not disks.empty else disks
        if not mine.empty and not table.empty:
            fullest = mine.groupby("time", as_index=False).agg(used_percent=("used_percent", "max"))
            usage = Metric(DISK_USAGE, schema.DISK, "used_percent", "%")
            times = table.index.as_unit("ns").asi8
            table[DISK_USAGE] = host_part(times, fullest, [usage], "")[usage.name].to_numpy()
    return tables
