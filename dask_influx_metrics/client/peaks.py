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

from typing import Optional

import pandas as pd

from .. import jobtags, schema
from .hosts import host_tables
from .query.base import DEVICE_MEASUREMENTS
from .query.store import Store
from .tables import device_columns, worker_tables

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


def peaks(
    store: Store, metric: str, per_job: bool = True, workers=None, job: Optional[int] = None, server: bool = True
) -> pd.DataFrame:
    """Tidy peaks of one metric of ``store`` (the module docstring).

    ``server=True`` lets the backend compute ``MAX ... GROUP BY worker,
    index, job`` (InfluxQL does it on the server; per job over busy
    samples only, ``dag != '0'``); ``False`` computes from the per-worker
    tables. Both give the same numbers. A host metric's peaks are its
    host's (``GROUP BY host, job``, or from :func:`.hosts.host_tables`), one row
    set for each worker of the host.
    """
    resolved = store.resolve_metrics([metric])
    if len(resolved) != 1:
        raise ValueError(f"metric {metric!r} has several fields; name one: {[x.name for x in resolved]}")
    m = resolved[0]
    chosen = store.select_workers(workers)
    job = store.check_job(job)
    if m.measurement == schema.HOST:
        found = _host_peaks(store, m, per_job, chosen, job, server)
    elif not server:
        tables = worker_tables(store, job=job, metrics=[m.name], workers=[w for _, w in chosen])
        found = from_tables(list(tables.values()), m.name, per_job, m.unit)
    else:
        by = ("worker",) + (("index",) if m.measurement in DEVICE_MEASUREMENTS else ()) + (("job",) if per_job else ())
        groups = store.backend.max_by(m.measurement, m.field, by, [w for _, w in chosen], job, busy=per_job)
        found = from_groups(groups, m, {w: i for i, w in chosen}, per_job)
    if job is not None and per_job:
        found = found[found["job"] == job].reset_index(drop=True)
    return found


def get_peaks(store: Store, metric: str = "mem-util", workers=None, per_job: bool = True, **kw) -> list:
    """The old ``get_peaks`` shapes: ``[{job: [peak per GPU]}, ...]`` or ``[[peak per GPU], ...]``.

    Per job, a peak is the largest value among the samples at which that
    job had tasks executing (``dag != "0"`` and the job in the ``job``
    tag); idle samples count for no job. ``"total-mem"``: device memory in
    use (bytes) on that GPU while the job ran: the whole device, every
    process on it. ``"worker-gpu-mem"``: the GPU memory (bytes) held by the
    worker's own process tree while the job ran on it. ``per_job=False``:
    the peak over every sample, idle ones included.
    """
    chosen = store.select_workers(workers)
    found = peaks(store, metric, per_job=per_job, workers=[w for _, w in chosen], **kw)
    return to_lists(found, per_job, [i for i, _ in chosen])


def _host_peaks(store: Store, metric, per_job: bool, chosen, job, server: bool) -> pd.DataFrame:
    """Peaks of a host metric: per host (server- or client-side), then one row set per worker."""
    where = store.hosts()
    hosts = sorted({where.get(w) for _, w in chosen} - {None})
    if server:  # by writer too, to leave out another tool's points of the host
        by = ("host",) + (("job",) if per_job else ())
        groups = store.backend.max_by(schema.HOST, metric.field, by + ("worker",), None, job, busy=per_job)
        groups = groups[groups["host"].isin(hosts) & groups["worker"].map(store.ours).astype(bool)]
        groups = groups.groupby(list(by), as_index=False)["max"].max().rename(columns={"host": "worker"})
        found = from_groups(groups, metric, {h: 0 for h in hosts}, per_job)
    else:
        tables = host_tables(store, [metric.name], job, hosts=hosts)
        found = from_tables(list(tables.values()), metric.name, per_job, metric.unit)
    workers = pd.DataFrame([(i, w, where.get(w)) for i, w in chosen], columns=["worker_index", "worker", "host"])
    rows = found.drop(columns=["worker_index"]).rename(columns={"worker": "host"}).merge(workers, on="host")
    return tidy(rows.drop(columns=["host", "metric", "unit"]), metric.name, metric.unit)
