"""Utilization summaries: the figures an operator uses to find wasted GPUs.

One row per worker, job and resource (``gpu``: all GPUs of the worker pooled,
``cpu``: the host's CPU): ``samples``, ``devices``, ``hours`` (wall time the
samples cover: samples x the sampling interval), ``mean`` and ``max``
utilization (%), ``above_20``/``above_40``/``above_80`` and ``at_100`` (share
of samples, 0-1), ``device_hours`` (hours x devices) and
``unused_device_hours`` (device_hours x (1 - mean / 100)). Rows with ``job``
``<NA>`` cover the whole session; the others the samples of that job (shared
samples count for each job in their tag).

>>> import pandas as pd
>>> t = pd.DataFrame({"job": ["1"] * 4, "dag": ["1"] * 4, "timestamp": [0.0, 0.5, 1.0, 1.5],
...                   "compute-util[0]": [0.0, 50.0, 100.0, 100.0], "host-cpu": [10.0] * 4})
>>> t.attrs = {"worker": "tcp://a:1", "worker_index": 0}
>>> s = summarize([t], per_job=False)
>>> s[["resource", "mean", "at_100", "device_hours"]].to_dict("records")[1]
{'resource': 'gpu', 'mean': 62.5, 'at_100': 0.5, 'device_hours': 0.0005555555555555556}
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import jobtags
from .tables import device_columns

GPU_METRIC = "compute-util"
CPU_METRIC = "host-cpu"
THRESHOLDS = (20, 40, 80)
COLUMNS = ["worker_index", "worker", "job", "resource", "samples", "devices", "hours", "mean", "max",
           *[f"above_{t}" for t in THRESHOLDS], "at_100", "device_hours", "unused_device_hours"]


def interval_seconds(table: pd.DataFrame) -> float:
    """The sampling interval: the median step between consecutive timestamps (0 if < 2 rows)."""
    steps = np.diff(table["timestamp"].to_numpy(dtype=float))
    steps = steps[steps > 0]
    return float(np.median(steps)) if len(steps) else 0.0


def _row(values: np.ndarray, devices: int, interval: float) -> dict:
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
    return row


def summarize(tables: list[pd.DataFrame], per_job: bool = True) -> pd.DataFrame:
    """Utilization summary rows for ``tables`` (whole session, and per job when ``per_job``)."""
    rows = []
    for table in tables:
        interval = interval_seconds(table)
        who = {"worker_index": table.attrs.get("worker_index", 0), "worker": table.attrs.get("worker", "")}
        jobs = jobtags.distinct(table["job"].unique()) if per_job else []
        for resource, metric in (("gpu", GPU_METRIC), ("cpu", CPU_METRIC)):
            cols = device_columns(table, metric)
            if not cols:
                continue
            devices = len(cols)
            rows.append({**who, "job": pd.NA, "resource": resource,
                         **_row(table[cols].to_numpy(dtype=float).ravel(), devices, interval)})
            for job in jobs:
                mask = jobtags.series_contains(table["job"], job).to_numpy()
                rows.append({**who, "job": job, "resource": resource,
                             **_row(table.loc[mask, cols].to_numpy(dtype=float).ravel(), devices, interval)})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["job"] = frame["job"].astype("Int64")
    return frame.sort_values(["worker_index", "resource", "job"], na_position="first", kind="stable").reset_index(drop=True)
