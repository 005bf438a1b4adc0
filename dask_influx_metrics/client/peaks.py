"""Peaks per worker, per GPU and per job: a tidy DataFrame, and the old tool's list shapes.

Per-job peaks count a sample for job J only when it is busy (``dag != "0"``)
and J is in its ``job`` tag (``"1,2"`` counts for 1 and 2): idle samples count
for no job, so a job is never charged what a device showed while its worker
waited (another worker's job on a shared GPU, memory left behind). Job ``0``
is never a job. Whole-session peaks (``per_job=False``) use every sample.
Tables read from the old dask-metrics tool's CSVs count every row of a job
instead (their ``dag`` column is unreliable; :class:`~dask_influx_metrics.jobtags.Rule`).
Because a maximum of maxima is the maximum, the server can group busy samples
by the raw ``job`` tag and the client splits the lists: server-side and
client-side peaks are equal by construction, and tested so.

The tidy form has one row per (worker, job, device): ``worker_index``,
``worker``, ``job`` (``<NA>`` for whole-session peaks), ``device`` (GPU index,
``<NA>`` for host/worker metrics), ``metric``, ``peak``, ``unit``.

>>> import pandas as pd
>>> t = pd.DataFrame({"job": ["1", "1,2", "2", "2"], "dag": ["1", "1,2", "2", "0"], "timestamp": [0, 1, 2, 3],
...                   "x[0]": [5.0, 7.0, 1.0, 8.0], "x[1]": [2.0, 3.0, 9.0, 10.0]})
>>> t.attrs = {"worker": "tcp://a:1", "worker_index": 0}
>>> tidy = from_tables([t], "x", per_job=True)
>>> to_lists(tidy, per_job=True)   # the idle last row counts for no job
[{1: [7, 3], 2: [7, 9]}]
>>> to_lists(from_tables([t], "x", per_job=False), per_job=False)
[[8, 10]]
"""

from __future__ import annotations

import pandas as pd

from .. import jobtags
from .tables import device_columns

COLUMNS = ["worker_index", "worker", "job", "device", "metric", "peak", "unit"]


def tidy(rows: pd.DataFrame, metric: str, unit: str) -> pd.DataFrame:
    """Rows with ``worker_index``, ``worker``, [``job``], [``device``], ``peak`` in the tidy form and order."""
    return _tidy(rows, metric, unit)


def _tidy(rows: pd.DataFrame, metric: str, unit: str) -> pd.DataFrame:
    rows = rows.assign(metric=metric, unit=unit)
    for c in ("job", "device"):
        rows[c] = rows[c].astype("Int64") if c in rows.columns else pd.array([pd.NA] * len(rows), dtype="Int64")
    rows = rows.sort_values(["worker_index", "job", "device"], na_position="first", kind="stable")
    return rows[COLUMNS].reset_index(drop=True)


def from_tables(tables: list[pd.DataFrame], metric: str, per_job: bool = True, unit: str = "") -> pd.DataFrame:
    """Client-side peaks from per-worker tables (each with ``attrs`` worker/worker_index)."""
    parts = []
    for table in tables:
        cols = device_columns(table, metric)
        if not cols:
            continue
        rows = table[jobtags.counting(table)] if per_job else table  # ours: idle samples count for no job
        # the maximum per raw job tag first, in C over the wide table (a maximum of maxima is the
        # maximum); only those few rows are melted and their tags split
        keys = rows["job"].to_numpy() if per_job else pd.Series("", index=rows.index).to_numpy()
        wide = rows[cols].groupby(keys, sort=False).max().rename_axis("job").reset_index()
        long = wide.melt(id_vars="job", var_name="column", value_name="value").dropna(subset=["value"])
        device = long["column"].str.extract(r"\[(\d+)\]$", expand=False)
        long = long.assign(device=pd.to_numeric(device))
        if per_job:
            long = jobtags.explode(long)  # "1,2" counts for 1 and 2; job 0 is dropped
        keys = (["job"] if per_job else []) + ["device"]
        peak = long.groupby(keys, dropna=False)["value"].max().rename("peak").reset_index()
        parts.append(peak.assign(worker_index=table.attrs.get("worker_index", 0), worker=table.attrs.get("worker", "")))
        unit = unit or table.attrs.get("units", {}).get(metric, "")
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return _tidy(pd.concat(parts, ignore_index=True), metric, unit)


def from_groups(groups: pd.DataFrame, metric, worker_index: dict[str, int], per_job: bool = True) -> pd.DataFrame:
    """Peaks from a backend's ``max_by`` rows (columns worker, index, [job], max) of one ``Metric``.

    For ``per_job`` the rows must be of busy samples only (``max_by(..., busy=True)``).
    """
    if groups.empty:
        return pd.DataFrame(columns=COLUMNS)
    frame = groups.assign(value=pd.to_numeric(groups["max"]) * metric.scale)
    if per_job:
        frame = jobtags.explode(frame)
    if "index" in frame.columns:
        frame = frame.assign(device=pd.to_numeric(frame["index"].replace("", None)))
    else:
        frame = frame.assign(device=pd.NA)
    keys = ["worker"] + (["job"] if per_job else []) + ["device"]
    peak = frame.groupby(keys, dropna=False)["value"].max().rename("peak").reset_index()
    peak["worker_index"] = peak["worker"].map(worker_index)
    return _tidy(peak.dropna(subset=["worker_index"]).astype({"worker_index": int}), metric.name, metric.unit)


def _number(v):
    v = float(v)
    return int(v) if v.is_integer() else v


def to_lists(tidy: pd.DataFrame, per_job: bool = True, workers=None) -> list:
    """The old shapes: a list per worker of ``{job: [peak per GPU]}`` or ``[peak per GPU]``.

    ``workers`` (worker indices) sets the order and includes workers without
    data (as ``{}`` or ``[]``); by default, the workers in ``tidy``. Always a
    list, even for one worker. Values are numbers: ints when integral.
    """
    if workers is None:
        workers = sorted(set(tidy["worker_index"]))
    out = []
    for w in workers:
        rows = tidy[tidy["worker_index"] == w].sort_values("device", na_position="first")
        if per_job:
            out.append({int(j): [_number(v) for v in g["peak"]] for j, g in rows.groupby("job", sort=True)})
        else:
            out.append([_number(v) for v in rows["peak"]])
    return out
