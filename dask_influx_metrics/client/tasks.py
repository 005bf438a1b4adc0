"""Why was the GPU idle? Tasks, Dask's fine performance metrics and GPU use, per job and DAG.

Three tidy DataFrames, read through any :class:`~dask_influx_metrics.query.Store` (InfluxQL,
Flux or a spool) from the ``task`` and ``activity`` points (tracking names ``task-stream`` and
``fine-metrics``) and the ``gpu`` samples:

- ``db.tasks()``: per job (``per_dag=True``: and DAG) and task prefix: ``tasks``, ``erred``,
  ``total_s``/``median_s``/``p95_s``/``max_s`` (execution time), ``compute_s``, ``transfer_s``,
  ``disk_read_s``, ``disk_write_s`` (Dask's startstops) and ``nbytes`` (result sizes, summed).
- ``db.activity()``: where worker time went, per ``job``, ``prefix``, ``activity``, ``unit``:
  ``value`` summed over the session (seconds, bytes, ... as ``unit`` says).
- ``db.gpu_during_tasks()``: mean and max ``utilization_gpu`` of the GPU samples that count for
  the job (busy, the job in the ``job`` tag; per DAG: the DAG in the ``dag`` tag): one row per
  job (``dag`` <NA>) and one per DAG. The mean is time-weighted, as in summaries
  (:func:`.summary.weights`): each sample counts for the time to the next one of its GPU.

``db.task_stream()`` gives the task points themselves. ``dag`` is read by name, so it may be a
tag or a field. An empty answer has a ``why`` in ``frame.attrs``.

>>> points = pd.DataFrame({"job": ["1", "1", "2"], "dag": ["1", "1", "2"], "prefix": ["a", "a", "b"],
...                        "state": ["memory", "error", "memory"], "duration": [1.0, 3.0, 2.0],
...                        "compute": [1.0, 2.0, 2.0], "nbytes": [10, None, 5]})
>>> summarize_tasks(points)[["job", "prefix", "tasks", "erred", "total_s", "max_s", "nbytes"]].values.tolist()
[[1, 'a', 2, 1, 4.0, 3.0, 10], [2, 'b', 1, 0, 2.0, 2.0, 5]]
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from .. import jobtags, schema
from .summary import weights

TASK_COLUMNS = list(schema.MEASUREMENT_TAGS[schema.TASK]) + [f for m, f in schema.FIELDS if m == schema.TASK]
ACTIVITY_COLUMNS = list(schema.MEASUREMENT_TAGS[schema.ACTIVITY]) + [
    f for m, f in schema.FIELDS if m == schema.ACTIVITY
]
STARTSTOPS = ("compute", "transfer", "disk_read", "disk_write")
TASKS = [
    "job",
    "dag",
    "prefix",
    "tasks",
    "erred",
    "total_s",
    "median_s",
    "p95_s",
    "max_s",
    *[f"{s}_s" for s in STARTSTOPS],
    "nbytes",
]
ACTIVITY = ["job", "prefix", "activity", "unit", "value"]
GPU = ["job", "dag", "samples", "mean_utilization_gpu", "max_utilization_gpu"]
UTIL = "utilization_gpu"
# "was the GPU busy": besides utilization, where collected, GPM's SM active / occupancy / tensor / DRAM
# (docs/attribution.md) and, on shared GPUs, the worker's own share of the SM time
DEPTH = ("sm_active", "sm_occupancy", "pipe_tensor_active", "dram_active", "worker_utilization_gpu")

NO_TASK_STREAM = "no task stream recorded: tracking `task-stream` is off, or no task finished in range"
NO_FINE_METRICS = "no fine performance metrics recorded: tracking `fine-metrics` is off, or no task ran in range"
NO_GPU = "no GPU utilization recorded: tracking `compute-util` is off, or the workers saw no GPU"


def _empty(columns, why: str) -> pd.DataFrame:
    frame = pd.DataFrame(columns=columns)
    frame.attrs["why"] = why
    return frame


def _numbers(values: pd.Series) -> pd.Series:
    """Job/DAG tags or fields ("2", 2, 2.0) as Int64."""
    return pd.to_numeric(values, errors="coerce").astype("Int64")


def summarize_tasks(points: pd.DataFrame, per_dag: bool = False) -> pd.DataFrame:
    """Task points -> counts and durations per job (and DAG) and prefix, slowest total first per job."""
    if points.empty:
        return _empty(TASKS if per_dag else [c for c in TASKS if c != "dag"], NO_TASK_STREAM)
    by = ["job", "dag", "prefix"] if per_dag else ["job", "prefix"]
    points = points.assign(
        job=_numbers(points["job"]), dag=_numbers(points["dag"]), erred=points["state"].eq("error").astype(int)
    )
    numbers = {
        c: pd.to_numeric(points[c]) if c in points.columns else pd.Series(0.0, index=points.index)
        for c in ("duration", *STARTSTOPS, "nbytes")
    }
    points = points.assign(**numbers)
    groups = points.groupby(by, sort=True)
    out = pd.DataFrame(
        {
            "tasks": groups.size(),
            "erred": groups["erred"].sum(),
            "total_s": groups["duration"].sum(),
            "median_s": groups["duration"].median(),
            "p95_s": groups["duration"].quantile(0.95),
            "max_s": groups["duration"].max(),
            **{f"{s}_s": groups[s].sum() for s in STARTSTOPS},
            "nbytes": groups["nbytes"].sum().astype("int64"),
        }
    ).reset_index()
    out = out.sort_values(["job", "total_s"], ascending=[True, False], kind="stable")
    return out[[c for c in TASKS if c in out.columns]].reset_index(drop=True)


def summarize_activity(points: pd.DataFrame) -> pd.DataFrame:
    """Activity points -> ``value`` summed per job, prefix, activity and unit (largest first per job).

    >>> p = pd.DataFrame({"job": ["1", "1", "1"], "prefix": ["a"] * 3, "activity": ["thread-cpu", "thread-cpu", "idle"],
    ...                   "unit": ["seconds"] * 3, "value": [1.0, 2.0, 0.5]})
    >>> summarize_activity(p).values.tolist()
    [[1, 'a', 'thread-cpu', 'seconds', 3.0], [1, 'a', 'idle', 'seconds', 0.5]]
    """
    if points.empty:
        return _empty(ACTIVITY, NO_FINE_METRICS)
    points = points.assign(job=_numbers(points["job"]), value=pd.to_numeric(points["value"]))
    out = points.groupby(ACTIVITY[:-1], sort=True)["value"].sum().reset_index()
    out = out.sort_values(["job", "unit", "value"], ascending=[True, True, False], kind="stable")
    return out.reset_index(drop=True)


def gpu_during(samples: pd.DataFrame, dag_jobs: dict) -> pd.DataFrame:
    """GPU samples (``job``, ``dag``, ``utilization_gpu``, optional ``seconds``: the time each stands for)
    -> mean (weighted by ``seconds`` where given) and max per job (``dag`` <NA>) and per DAG.

    ``dag_jobs`` maps each DAG to its job (from the ``dag`` points); a DAG it lacks gets job <NA>.

    >>> s = pd.DataFrame({"job": ["1", "1", "1,2", "2"], "dag": ["1", "0", "1,2", "2"],
    ...                   "utilization_gpu": [50.0, 0.0, 100.0, 30.0]})
    >>> gpu_during(s, {1: 1, 2: 2})[["job", "dag", "samples", "mean_utilization_gpu"]].values.tolist()
    [[1, <NA>, 2, 75.0], [1, 1, 2, 75.0], [2, <NA>, 2, 65.0], [2, 2, 2, 65.0]]
    >>> d = s.assign(sm_occupancy=[14.0, None, 20.0, None])  # GPM where collected (Hopper+): its own samples
    >>> gpu_during(d, {1: 1, 2: 2})[["job", "dag", "mean_sm_occupancy", "max_sm_occupancy"]].values.tolist()
    [[1, <NA>, 17.0, 20.0], [1, 1, 17.0, 20.0], [2, <NA>, 20.0, 20.0], [2, 2, 20.0, 20.0]]
    """
    busy = samples[jobtags.busy(samples["dag"])] if not samples.empty else samples
    if busy.empty:
        return _empty(GPU, NO_GPU)
    fields = [UTIL] + [f for f in DEPTH if f in busy]
    busy = busy.assign(**{f: pd.to_numeric(busy[f]) for f in fields}).dropna(subset=fields, how="all")
    seconds = busy["seconds"] if "seconds" in busy else pd.Series(1.0, index=busy.index)
    timed = {f"_time_{f}": seconds.where(busy[f].notna()) for f in fields}  # a field's own samples only
    busy = busy.assign(**timed, **{f"_area_{f}": busy[f] * seconds for f in fields})
    rows = []
    for column in ("job", "dag"):
        per = jobtags.explode(busy[[column, *fields, *timed, *(f"_area_{f}" for f in fields)]], column).groupby(column)
        stats = per.agg(
            count=(UTIL, "count"),
            **{f"mean_{f}": (f, "mean") for f in fields},
            **{f"max_{f}": (f, "max") for f in fields},
            **{f"time_{f}": (f"_time_{f}", "sum") for f in fields},
            **{f"area_{f}": (f"_area_{f}", "sum") for f in fields},
        )
        for number, s in stats.iterrows():
            job = number if column == "job" else dag_jobs.get(number, pd.NA)
            row = {"job": job, "dag": pd.NA if column == "job" else number, "samples": int(s["count"])}
            for f in fields:  # time-weighted where the samples' times are known
                row[f"mean_{f}"] = s[f"area_{f}"] / s[f"time_{f}"] if s[f"time_{f}"] > 0 else s[f"mean_{f}"]
                row[f"max_{f}"] = s[f"max_{f}"]
            rows.append(row)
    columns = GPU + [f"{k}_{f}" for f in fields[1:] for k in ("mean", "max")]
    out = pd.DataFrame(rows, columns=columns).astype({"job": "Int64", "dag": "Int64"})
    return out.sort_values(["job", "dag"], na_position="first", kind="stable").reset_index(drop=True)


def _timed(frame: pd.DataFrame) -> pd.DataFrame:
    """One worker's GPU samples with ``seconds``: the time each stands for (:func:`.summary.weights`, per GPU)."""
    frame = frame.assign(**{UTIL: pd.to_numeric(frame[UTIL])}).sort_values("time", kind="stable")
    parts = []
    for _, one in frame.groupby("index", sort=False, dropna=False) if "index" in frame else [(None, frame)]:
        times = one["time"].to_numpy(dtype="int64")
        seconds = weights((times - times[0]) / 1e9, one[[UTIL]].to_numpy(dtype=float))[:, 0]
        parts.append(one.assign(seconds=seconds))
    return pd.concat(parts)


def _only(frame: pd.DataFrame, job: Optional[int]) -> pd.DataFrame:
    if job is None or frame.empty:
        return frame
    out = frame[frame["job"] == job].reset_index(drop=True)
    out.attrs = dict(frame.attrs)
    return out


class TaskQuestions:
    """The :class:`~dask_influx_metrics.query.Store` methods of this module (mixed into it)."""

    def task_stream(self, job: Optional[int] = None) -> pd.DataFrame:
        """The ``task`` points: ``time`` (ns, when each task ended), tags and fields; ``job``/``dag`` as Int64."""
        job = self.check_job(job)
        points = self.backend.points(schema.TASK, TASK_COLUMNS)
        if points.empty:
            return _empty(["time"] + TASK_COLUMNS, NO_TASK_STREAM)
        points = points.assign(job=_numbers(points["job"]), dag=_numbers(points["dag"]))
        return _only(points, job)

    def tasks(self, job: Optional[int] = None, per_dag: bool = False) -> pd.DataFrame:
        """Task counts and durations per job (and DAG) and prefix; see the module docstring."""
        return _only(summarize_tasks(self.task_stream(job), per_dag=per_dag), job)

    def activity(self, job: Optional[int] = None) -> pd.DataFrame:
        """Where worker time went (Dask's fine performance metrics) per job, prefix, activity and unit."""
        job = self.check_job(job)
        return _only(summarize_activity(self.backend.points(schema.ACTIVITY, ACTIVITY_COLUMNS)), job)

    def gpu_during_tasks(self, job: Optional[int] = None) -> pd.DataFrame:
        """Was the GPU busy: mean/max GPU utilization while each job (and DAG) had tasks executing, and
        where collected GPM's SM active, SM occupancy, tensor and DRAM activity, and the job's workers'
        share of a shared GPU's SM time (``worker_utilization_gpu``)."""
        job = self.check_job(job)
        have = self.fields().get(schema.GPU, ())
        if UTIL not in have:
            return _empty(GPU, NO_GPU)
        fields = [UTIL] + [f for f in DEPTH if f in have]
        # every sample, not the job's only: a sample stands for the time to the next one of its GPU
        frames = [self.backend.frame(schema.GPU, fields, w) for w in self.workers()]
        samples = pd.concat([_timed(f) for f in frames if not f.empty] or [frames[0]], ignore_index=True)
        dags = self.dags()
        return _only(gpu_during(samples, dict(zip(dags["dag"], dags["job"]))), job)

    def report(self, path, title: Optional[str] = None) -> str:
        """Write the one-file HTML report (see :mod:`dask_influx_metrics.client.report`); returns ``path``."""
        from .report import write

        return write(self, path, title=title)
