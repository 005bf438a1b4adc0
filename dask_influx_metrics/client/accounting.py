"""Per-job GPU accounting read back: the agents' ``accounting`` totals as one table (:func:`accounting`).

Each ``accounting`` point carries a row's totals so far (docs/attribution.md, "Accounting"), so a row's
last point in range is its total: a lost point costs nothing, the next one carries it. A row is a series
(``host``, ``worker`` = its sender, ``job``, ``uuid``, ``since``); a sender that restarted, or a job whose rows
were dropped and made again, starts a new ``since`` from 0: the rows of one (job, host, GPU) are added up.
With a time range that starts after a row's counting began, its last value before the range is subtracted
(as PromQL's ``increase``); ``memory_peak_bytes`` then stays the row's peak since it began.

The table (:func:`table`): one row per job and GPU (``host``, ``uuid``), one per job and host for the CPU
(``uuid`` <NA>), one total per job (``host`` and ``uuid`` <NA>: GPU figures summed over its GPUs, the peak
memory the largest of one GPU's, the mean memory the sum of its GPUs'), and the idle rows (``job`` <NA>: no
job's). Columns: :data:`COLUMNS`.

>>> last = pd.DataFrame({"host": "h", "worker": "agent-h", "job": ["1", "1", "idle", "1"],
...                      "uuid": ["GPU-a", "GPU-a", "GPU-a", ""], "since": ["5", "9", "5", "5"],
...                      "gpu_seconds": [10.0, 2.0, 3.0, None], "busy_seconds": [8.0, 1.0, 0.5, None],
...                      "cpu_seconds": [None, None, None, 4.0]})
>>> t = table(last)
>>> t[["job", "uuid", "gpu_seconds", "busy_seconds", "cpu_seconds"]].values.tolist()
[[1, 'GPU-a', 12.0, 9.0, nan], [1, <NA>, nan, nan, 4.0], [1, <NA>, 12.0, 9.0, 4.0], [<NA>, 'GPU-a', 3.0, 0.5, nan], [<NA>, <NA>, 3.0, 0.5, nan]]
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from .. import schema
from .query.store import Store
from .tables import not_recorded

BY = schema.MEASUREMENT_TAGS[schema.ACCOUNTING]  # host, worker, job, uuid, since: one row's series
FIELDS = schema.ACCOUNTING_FIELDS
SUMMED = [f for f in FIELDS if f != "memory_peak_bytes"]  # counters; the peak is a maximum
GPU_SUMS = ("gpu_seconds", "busy_seconds", "sm_active_seconds", "tensor_active_seconds", "energy_joules")
COLUMNS = [
    "job",
    "host",
    "uuid",
    "gpu_seconds",
    "busy_seconds",
    "sm_active_seconds",
    "tensor_active_seconds",
    "energy_joules",
    "memory_peak_bytes",
    "memory_mean_bytes",
    "cpu_seconds",
]
NONE = not_recorded("accounting", ["accounting"], "no sampler ran while the range lasted")


def increase(last: pd.DataFrame, before: pd.DataFrame | None) -> pd.DataFrame:
    """``last`` (each row's last values in range) less ``before`` (its last values before the range, where it
    began earlier); the peak stays."""
    if before is None or before.empty or last.empty:
        return last
    key = list(BY)
    base = last[key].merge(before, on=key, how="left")
    out = last.copy()
    for f in SUMMED:
        if f in out and f in base:
            out[f] = pd.to_numeric(out[f]) - pd.to_numeric(base[f]).fillna(0.0).to_numpy()
    return out


def table(last: pd.DataFrame) -> pd.DataFrame:
    """The accounting table from each row's totals (``BY`` columns and fields; see the module docstring)."""
    if last.empty:
        out = pd.DataFrame(columns=COLUMNS)
        out.attrs["why"] = NONE
        return out
    frame = last.reindex(columns=[*BY, *FIELDS]).copy()
    for f in FIELDS:
        frame[f] = pd.to_numeric(frame[f], errors="coerce")
    frame["uuid"] = frame["uuid"].astype(object).fillna("").astype(str)
    agg = {f: ("max" if f == "memory_peak_bytes" else lambda v: v.sum(min_count=1)) for f in FIELDS}
    rows = frame.groupby(["job", "host", "uuid"], sort=False).agg(agg).reset_index()
    gpu = rows[rows["uuid"] != ""].copy()
    gpu["memory_mean_bytes"] = gpu["memory_byte_seconds"] / gpu["gpu_seconds"].where(gpu["gpu_seconds"] > 0)
    cpu = rows[rows["uuid"] == ""][["job", "host", "cpu_seconds"]].assign(uuid=pd.NA)
    gpu = gpu.drop(columns=["cpu_seconds"])
    totals = []
    for job in sorted(set(rows["job"]), key=_order):
        g, c = gpu[gpu["job"] == job], cpu[cpu["job"] == job]
        total = {f: g[f].sum(min_count=1) for f in GPU_SUMS}
        total.update(
            job=job,
            host=pd.NA,
            uuid=pd.NA,
            memory_peak_bytes=g["memory_peak_bytes"].max(),
            memory_mean_bytes=g["memory_mean_bytes"].sum(min_count=1),
            cpu_seconds=c["cpu_seconds"].sum(min_count=1),
        )
        totals.append(total)
    out = pd.concat([gpu, cpu, pd.DataFrame(totals)], ignore_index=True)
    out["_level"] = np.where(out["host"].isna(), 2, np.where(out["uuid"].isna(), 1, 0))
    out["_job"] = out["job"].map(_order)
    out = out.sort_values(["_job", "_level", "host", "uuid"], kind="stable", na_position="last")
    out["job"] = pd.array([pd.NA if j == schema.IDLE_JOB else int(j) for j in out["job"]], dtype="Int64")
    out = out.reset_index(drop=True)
    out.attrs["idle"] = "job <NA>: the idle rows (no job's: time no job ran, kernels of no job, unattributed)"
    return out[COLUMNS]


def _order(job: str) -> tuple:
    return (1, 0) if job == schema.IDLE_JOB else (0, int(job))


def accounting(store: Store, job: Optional[int] = None) -> pd.DataFrame:
    """Per-job GPU accounting of ``store`` from the samplers' running totals (tracking name ``accounting``): one
    row per job and GPU, per job and host (CPU), per job (totals), and the idle rows (``job`` <NA>); see the
    module docstring. With a time range, each total's increase within it."""
    last = store.backend.last_by(schema.ACCOUNTING, list(FIELDS), BY)
    before = None
    if store.backend.start_ns is not None and not last.empty:  # rows that began before the range
        earlier = store.backend.widened()
        earlier.tags, earlier.stop_ns = dict(store.backend.tags), store.backend.start_ns - 1
        before = earlier.last_by(schema.ACCOUNTING, list(FIELDS), BY)
    out = table(increase(last, before))
    if job is not None:
        known = sorted(j for j in out["job"].dropna().unique())
        if job not in known:
            raise ValueError(f"job {job!r} has no accounting rows; jobs: {known} ({store.scope()})")
        out = out[out["job"] == job].reset_index(drop=True)
    return out
