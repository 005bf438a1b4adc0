"""Utilization summaries: the figures an operator uses to find wasted GPUs.

One row per worker, job and resource (``gpu``: all GPUs of the worker pooled,
``cpu``: the host's CPU): ``samples``, ``devices``, ``hours`` (wall time the
samples cover: samples x the sampling interval), ``mean`` and ``max``
utilization (%), ``above_20``/``above_40``/``above_80`` and ``at_100`` (share
of samples, 0-1), ``device_hours`` (hours x devices), ``unused_device_hours``
(device_hours x (1 - mean / 100)) and ``held_idle_device_hours``.

**Held but idle** (``held_idle_device_hours``, gpu rows): device-hours in
which the worker holds GPU memory while the GPU computes nothing. Each
(sample, GPU) pair counts one sampling interval when ``compute-util`` is 0 and
the worker holds memory on that GPU: ``worker-gpu-mem`` > 0 (the worker's own
process tree), or, in a sample without that field, ``total-mem`` > 0 (the
whole device). NaN when neither memory metric was collected, and on cpu rows.

**Host CPU** (cpu rows): with ``hosts`` (``{worker: its host's table}``,
:meth:`~dask_influx_metrics.query.Store.host_tables_by_worker`) a worker's cpu
rows are its host's: the host series with its own ``job``/``dag`` tags (the
jobs of every worker of the host), so every worker of a host shows the same
cpu figures, and a job's cpu rows cover the samples at which it ran anywhere on
the host. Without ``hosts``, from the worker's own table (its own tags).

Rows with ``job`` ``<NA>`` cover the whole session, every sample. The others
cover the samples that count for that job: busy (``dag != "0"``) with the job
in the ``job`` tag (shared samples count for each job in their tag); idle
samples count for no job.

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

import numpy as np
import pandas as pd

from .. import jobtags
from .tables import device_columns

GPU_METRIC = "compute-util"
CPU_METRIC = "host-cpu"
# Held GPU memory: the worker's own first, the whole device's where a sample lacks it.
MEMORY_METRICS = ("worker-gpu-mem", "total-mem")
THRESHOLDS = (20, 40, 80)
COLUMNS = ["worker_index", "worker", "job", "resource", "samples", "devices", "hours", "mean", "max",
           *[f"above_{t}" for t in THRESHOLDS], "at_100", "device_hours", "unused_device_hours",
           "held_idle_device_hours"]


def interval_seconds(table: pd.DataFrame) -> float:
    """The sampling interval: ``attrs["interval"]`` when set (host tables), else the median step
    between consecutive timestamps (0 if < 2 rows)."""
    if table.attrs.get("interval") is not None:
        return float(table.attrs["interval"])
    steps = np.diff(table["timestamp"].to_numpy(dtype=float))
    steps = steps[steps > 0]
    return float(np.median(steps)) if len(steps) else 0.0


def held_memory(table: pd.DataFrame, util_columns: list[str]):
    """Per sample and GPU of ``util_columns``: 1.0 where the worker holds GPU memory, 0.0 where not, NaN unknown.

    ``worker-gpu-mem[i] > 0`` where that value exists, else ``total-mem[i] > 0``;
    None when the table has neither metric.
    """
    names = [[m + column[len(GPU_METRIC):] for m in MEMORY_METRICS] for column in util_columns]
    if not any(n in table.columns for pair in names for n in pair):
        return None
    nan = np.full(len(table), np.nan)
    held = []
    for pair in names:
        own, whole = (table[n].to_numpy(dtype=float) if n in table.columns else nan for n in pair)
        held.append(np.where(np.isnan(own), np.where(np.isnan(whole), np.nan, whole > 0), own > 0))
    return np.column_stack(held)


def _row(util: np.ndarray, held, interval: float) -> dict:
    """Figures of ``util`` (samples x devices) and ``held`` (same shape, or None)."""
    devices = util.shape[1]
    values = util.ravel()
    values = values[~np.isnan(values)]
    samples = len(values) // max(devices, 1)
    hours = samples * interval / 3600
    mean = float(values.mean()) if len(values) else float("nan")
    row = {"samples": samples, "devices": devices, "hours": hours, "mean": mean,
           "max": float(values.max()) if len(values) else float("nan")}
    for t in THRESHOLDS:
        row[f"above_{t}"] = float((values > t).mean()) if len(values) else float("nan")
    row["at_100"] = float((values >= 100).mean()) if len(values) else float("nan")
    row["device_hours"] = hours * devices
    row["unused_device_hours"] = row["device_hours"] * (1 - mean / 100) if len(values) else 0.0
    row["held_idle_device_hours"] = (float(((held == 1) & (util == 0)).sum()) * interval / 3600
                                     if held is not None else float("nan"))
    return row


def summarize(tables: list[pd.DataFrame], per_job: bool = True, hosts: dict | None = None) -> pd.DataFrame:
    """Utilization summary rows for ``tables`` (whole session, and per job when ``per_job``);
    ``hosts``: ``{worker: host table}``, where the cpu rows come from (see the module docstring)."""
    rows = []
    for own in tables:
        who = {"worker_index": own.attrs.get("worker_index", 0), "worker": own.attrs.get("worker", "")}
        for resource, metric in (("gpu", GPU_METRIC), ("cpu", CPU_METRIC)):
            table = own if hosts is None or resource == "gpu" else hosts.get(who["worker"])
            if table is None:
                continue
            interval = interval_seconds(table)
            jobs = jobtags.distinct(table.loc[jobtags.counting(table), "job"].unique()) if per_job else []
            cols = device_columns(table, metric)
            if not cols:
                continue
            util = table[cols].to_numpy(dtype=float)
            held = held_memory(table, cols) if resource == "gpu" else None
            rows.append({**who, "job": pd.NA, "resource": resource, **_row(util, held, interval)})
            for job in jobs:
                mask = jobtags.counts_for(table, job).to_numpy()
                rows.append({**who, "job": job, "resource": resource,
                             **_row(util[mask], None if held is None else held[mask], interval)})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["job"] = frame["job"].astype("Int64")
    return frame.sort_values(["worker_index", "resource", "job"], na_position="first", kind="stable").reset_index(drop=True)
