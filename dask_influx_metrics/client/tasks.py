"""Why was the GPU idle? Tasks, Dask's fine performance metrics and GPU use, per job, DAG and task prefix.

Tidy DataFrames, each function reading a :class:`~dask_influx_metrics.query.Store` ``db`` (InfluxQL,
Flux or a spool) from the ``task`` and ``activity`` points (tracking names ``task-stream`` and
``fine-metrics``) and the ``gpu`` samples:

- ``tasks(db)``: per job (``per_dag=True``: and DAG) and task prefix: ``tasks``, ``erred``,
  ``total_s``/``median_s``/``p95_s``/``max_s`` (execution time), ``compute_s``, ``transfer_s``,
  ``disk_read_s``, ``disk_write_s`` (Dask's startstops) and ``nbytes`` (result sizes, summed).
- ``activity(db)``: where worker time went, per ``job``, ``prefix``, ``activity``, ``unit``:
  ``value`` summed over the session (seconds, bytes, ... as ``unit`` says).
- ``gpu_during_tasks(db)``: mean and max ``utilization_gpu`` of the GPU samples that count for
  the job (busy, the job in the ``job`` tag; per DAG: the DAG in the ``dag`` tag): one row per
  job (``dag`` <NA>) and one per DAG. The mean is time-weighted, as in summaries
  (:func:`.summary.weights`): each sample counts for the window before it (from the previous one of its GPU).
- ``gpu_per_prefix(db)``: the same question per job (and DAG) and task prefix, from the samples of
  each task's worker's own GPU during the task, and the worker's GPU memory delta (:func:`prefix_gpu`).

``task_stream(db)`` gives the task points themselves. ``dag`` is read by name, so it may be a
tag or a field. An empty answer has a ``why`` in ``frame.attrs``.

>>> points = pd.DataFrame({"job": ["1", "1", "2"], "dag": ["1", "1", "2"], "prefix": ["a", "a", "b"],
...                        "state": ["memory", "error", "memory"], "duration": [1.0, 3.0, 2.0],
...                        "compute": [1.0, 2.0, 2.0], "nbytes": [10, None, 5]})
>>> summarize_tasks(points)[["job", "prefix", "tasks", "erred", "total_s", "max_s", "nbytes"]].values.tolist()
[[1, 'a', 2, 1, 4.0, 3.0, 10], [2, 'b', 1, 0, 2.0, 2.0, 5]]
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from .. import jobtags, schema
from . import shares
from .query.store import Store
from .summary import weights
from .tables import not_recorded

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
# (docs/attribution.md), each the job's own and the device's (:mod:`.shares`), and on shared GPUs the
# worker's share of the kernel time and its own SM time
GPM = ("sm_active", "sm_occupancy", "pipe_tensor_active", "dram_active")
PER_WORKER = (shares.SHARE, "worker_utilization_gpu")

# per task prefix: the readings during its tasks (the job's own and the device's), and the worker's GPU
# memory across them
PREFIX_DEVICE = (UTIL, "sm_active", "sm_occupancy", "pipe_tensor_active")
MEMORY = "worker_memory_used"
PREFIX_GPU = ["job", "dag", "prefix", "tasks", "gpu_s", "mean_utilization_gpu", "mean_memory_delta", "max_memory_delta"]

NO_TASK_STREAM = not_recorded("task stream", ["task-stream"], "no task finished in range")
NO_FINE_METRICS = not_recorded("fine performance metrics", ["fine-metrics"], "no task ran in range")
NO_GPU = not_recorded("GPU utilization", ["compute-util"], "the workers saw no GPU")
NO_GPU_SAMPLES = not_recorded("GPU samples", ["compute-util", "gpm", "worker-gpu-mem"], "the workers saw no GPU")
NO_OWN_GPU = (
    "no GPU sample of the task's workers' own GPUs (index 0) under their worker tags: {workers} used no GPU, "
    "or `worker-gpu-mem` was off on GPUs another worker sampled"
)


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
    -> mean (weighted by ``seconds`` where given) and max per job (``dag`` <NA>) and per DAG, of each field
    present: utilization, GPM's (:data:`GPM`), the per-worker :data:`PER_WORKER` and the ``device_`` ones
    (:func:`.shares.own`).

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
    own = [UTIL, *GPM, *PER_WORKER]
    fields = [f for f in (*own, *(shares.DEVICE + f for f in (UTIL, *GPM))) if f in busy]
    busy = busy.assign(**{f: pd.to_numeric(busy[f]) for f in fields}).dropna(subset=fields, how="all")
    seconds = busy["seconds"] if "seconds" in busy else pd.Series(1.0, index=busy.index)
    timed = {f"_time_{f}": seconds.where(busy[f].notna()) for f in fields}  # a field's own samples only
    busy = busy.assign(**timed, **{f"_area_{f}": busy[f] * seconds for f in fields}, _one=1)
    rows = []
    for column in ("job", "dag"):
        kept = [column, "_one", *fields, *timed, *(f"_area_{f}" for f in fields)]
        per = jobtags.explode(busy[kept], column).groupby(column)
        stats = per.agg(
            count=("_one", "sum"),
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
    columns = GPU + [f"{k}_{f}" for f in fields if f != UTIL for k in ("mean", "max")]
    out = pd.DataFrame(rows, columns=columns).astype({"job": "Int64", "dag": "Int64"})
    out = out.sort_values(["job", "dag"], na_position="first", kind="stable").reset_index(drop=True)
    out.attrs["figures"] = shares.NOTE
    return out


def _own_gpus(samples: pd.DataFrame) -> pd.Series:
    """Worker -> the GPU id of its own GPU: its index "0" (dask-cuda lists a worker's own GPU first)."""
    own = samples[samples["index"].astype(str).eq("0")]
    return own.groupby("worker", sort=False)["gpu"].first()


def _gpu_ids(samples: pd.DataFrame) -> pd.Series:
    """Which physical GPU each sample is of: its ``uuid``; older points without one, their writer and index."""
    uuid = samples["uuid"] if "uuid" in samples else pd.Series(pd.NA, index=samples.index, dtype=object)
    mine = samples["worker"].astype(str) + "/" + samples["index"].astype(str)
    return uuid.where(uuid.notna() & uuid.ne(""), mine)


def _covered(times: np.ndarray, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple:
    """Seconds of each [start, end] (s) covered by one GPU's sample windows, and the integral of the readings
    over them. A reading describes the window that ends at its time: from the previous sample (at most
    :func:`.summary.weights`' cap); the first sample's, one median step. A NaN reading (unknown) covers
    nothing."""
    lengths = weights(times, np.ones((len(times), 1)))[:, 0]
    lefts = times - lengths
    known = ~np.isnan(values)
    values = np.where(known, values, 0.0)
    total = np.concatenate([[0.0], np.cumsum(lengths * known)])
    area = np.concatenate([[0.0], np.cumsum(lengths * values)])

    def upto(x):  # (covered seconds, integral) from the first window to x
        k = np.searchsorted(times, x, side="left")  # the window x falls in (or the gap before it)
        last = np.minimum(k, len(times) - 1)
        part = np.where(k < len(times), np.clip(x - lefts[last], 0.0, None) * known[last], 0.0)
        return total[k] + part, area[k] + part * values[last]

    (c0, a0), (c1, a1) = upto(starts), upto(ends)
    return c1 - c0, a1 - a0


def _memory_deltas(series: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``worker_memory_used`` at the first sample at/after each end minus the last at/before each start; NaN
    where either is missing."""
    times, values = series["t"].to_numpy(), series[MEMORY].to_numpy(dtype=float)
    before = np.searchsorted(times, starts, side="right") - 1
    after = np.searchsorted(times, ends, side="left")
    ok = (before >= 0) & (after < len(times))
    return np.where(ok, values[np.minimum(after, len(times) - 1)] - values[np.maximum(before, 0)], np.nan)


def prefix_gpu(tasks: pd.DataFrame, samples: pd.DataFrame, per_dag: bool = False) -> pd.DataFrame:
    """Task points and ``gpu`` samples -> per job (and DAG) and prefix: ``tasks``, ``gpu_s`` (task seconds
    covered by samples of the worker's own GPU), the time-weighted mean of each reading of
    :data:`PREFIX_DEVICE` collected during the tasks: the job's own (``mean_<field>``) and the device's
    (``mean_device_<field>``, :mod:`.shares`), and ``mean_memory_delta`` / ``max_memory_delta`` (MiB) of
    the worker's ``worker_memory_used`` across each task.

    A task's GPU is its worker's index "0" (by ``uuid``), read from that worker's own points (in older
    data, where one worker wrote a GPU's device points, from that writer's). Each sample counts for the
    overlap of its window (the previous sample of that GPU .. its time) with the task's [start, end], so
    a 5 ms task inside one 100 ms window gets that window's value. The device figures count other work on
    the GPU at the same time too; the own ones scale them by the worker's share of a shared GPU's kernel
    time (``worker_gpu_share``). A memory delta includes what other tasks on the worker allocated
    meanwhile, and is 0 under a pool allocator (RMM) that does not grow. NA where nothing was measured.

    >>> s = pd.DataFrame({"time": [1e9, 2e9, 3e9, 4e9], "worker": "w", "index": "0", "uuid": "GPU-1",  # each second
    ...                   "utilization_gpu": [0.0, 90.0, 60.0, 0.0], "worker_memory_used": [10.0, 10.0, 30.0, 30.0],
    ...                   "worker_gpu_share": 50.0})  # a shared GPU: the worker ran half its kernel time
    >>> t = pd.DataFrame({"time": [3e9, 2.1e9], "worker": "w", "job": 1, "dag": 1, "prefix": ["a", "b"],
    ...                   "start": [1.5, 2.05]})  # a: half of (1, 2] s at 90, all of (2, 3] at 60; b: 50 ms at 60
    >>> prefix_gpu(t, s).round(3).values.tolist()
    [[1, 'a', 1, 1.5, 35.0, 70.0, 20.0, 20.0], [1, 'b', 1, 0.05, 30.0, 60.0, 20.0, 20.0]]
    """
    columns = PREFIX_GPU if per_dag else [c for c in PREFIX_GPU if c != "dag"]
    if tasks.empty:
        return _empty(columns, NO_TASK_STREAM)
    fields = [f for f in (*PREFIX_DEVICE, MEMORY) if f in samples and pd.to_numeric(samples[f]).notna().any()]
    if samples.empty or not fields:
        return _empty(columns, NO_GPU_SAMPLES)
    samples = samples.assign(gpu=_gpu_ids(samples), t=pd.to_numeric(samples["time"]).astype("int64"))
    samples = samples.assign(**{f: pd.to_numeric(samples[f]) for f in fields}).sort_values("t", kind="stable")
    samples = shares.own(samples, ["worker", "gpu"])
    unknown = shares.unknown(samples)
    own = _own_gpus(samples)
    tasks = tasks.assign(gpu=tasks["worker"].map(own)).reset_index(drop=True)
    if tasks["gpu"].isna().all():
        return _empty(columns, NO_OWN_GPU.format(workers=sorted(set(tasks["worker"].astype(str)))))
    origin = int(samples["t"].iloc[0])
    ends = (pd.to_numeric(tasks["time"]).astype("int64") - origin) / 1e9
    starts = pd.to_numeric(tasks["start"]) - origin / 1e9
    starts = starts.fillna(ends - pd.to_numeric(tasks["duration"])) if "duration" in tasks else starts
    timed = (starts <= ends).to_numpy()  # a task without a start covers nothing
    starts = starts.where(timed, ends)
    samples = samples.assign(t=(samples["t"] - origin) / 1e9)
    device = [f for f in PREFIX_DEVICE if f in fields]
    figures = [*device, *(shares.DEVICE + f for f in device)]  # the job's own, then the device's
    got = {f"{k}_{f}": np.zeros(len(tasks)) for f in figures for k in ("time", "area")}
    got["delta"] = np.full(len(tasks), np.nan)
    for (worker, gpu), rows in tasks.groupby(["worker", "gpu"], sort=False).indices.items():
        of_gpu = samples[samples["gpu"] == gpu]
        mine = of_gpu[of_gpu["worker"] == worker]
        s, e = starts.to_numpy()[rows], ends.to_numpy()[rows]
        for f in device:
            # the task's worker's own points of its GPU; in older data (one writer per GPU), the writer's
            series = mine[mine[shares.DEVICE + f].notna()]
            series = series if len(series) else of_gpu[of_gpu[shares.DEVICE + f].notna()]
            for name in (f, shares.DEVICE + f) if len(series) else ():
                covered, area = _covered(series["t"].to_numpy(), series[name].to_numpy(float), s, e)
                got[f"time_{name}"][rows], got[f"area_{name}"][rows] = covered, area
        if MEMORY in fields:
            got["delta"][rows] = _memory_deltas(mine[mine[MEMORY].notna()], s, e)
    got["delta"][~timed] = np.nan
    by = ["job", "dag", "prefix"] if per_dag else ["job", "prefix"]
    groups = tasks[by].assign(**got, n=1).groupby(by, sort=True)
    sums = groups.sum(numeric_only=True)
    gpu_s = sums[f"time_{shares.DEVICE}{device[0]}"] if device else np.nan
    out = pd.DataFrame({"tasks": sums["n"], "gpu_s": gpu_s})
    for f in figures:  # task-time weighted; NA where no sample covered the prefix's tasks
        out[f"mean_{f}"] = (sums[f"area_{f}"] / sums[f"time_{f}"]).where(sums[f"time_{f}"] > 0)
    out["mean_memory_delta"], out["max_memory_delta"] = groups["delta"].mean(), groups["delta"].max()
    out = out.reset_index().astype({"tasks": "int64"})
    out = out.sort_values(["job", "gpu_s"], ascending=[True, False], kind="stable").reset_index(drop=True)
    more = [f"mean_{f}" for f in figures if f != UTIL]  # GPM only where collected
    out = out.reindex(columns=[*columns[:-2], *more, *columns[-2:]])
    out.attrs.update(figures=shares.NOTE, unknown=unknown)
    return out


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


def task_stream(store: Store, job: Optional[int] = None) -> pd.DataFrame:
    """The ``task`` points: ``time`` (ns, when each task ended), tags and fields; ``job``/``dag`` as Int64."""
    job = store.check_job(job)
    points = store.backend.points(schema.TASK, TASK_COLUMNS)
    if points.empty:
        return _empty(["time"] + TASK_COLUMNS, NO_TASK_STREAM)
    points = points.assign(job=_numbers(points["job"]), dag=_numbers(points["dag"]))
    return _only(points, job)


def tasks(store: Store, job: Optional[int] = None, per_dag: bool = False) -> pd.DataFrame:
    """Task counts and durations per job (and DAG) and prefix; see the module docstring."""
    return _only(summarize_tasks(task_stream(store, job), per_dag=per_dag), job)


def activity(store: Store, job: Optional[int] = None) -> pd.DataFrame:
    """Where worker time went (Dask's fine performance metrics) per job, prefix, activity and unit."""
    job = store.check_job(job)
    return _only(summarize_activity(store.backend.points(schema.ACTIVITY, ACTIVITY_COLUMNS)), job)


def gpu_during_tasks(store: Store, job: Optional[int] = None) -> pd.DataFrame:
    """Was the GPU busy: mean/max GPU utilization while each job (and DAG) had tasks executing, and
    where collected GPM's SM active, SM occupancy, tensor and DRAM activity: the job's own figures
    (scaled by its workers' share of a shared GPU) and the device's (``device_``, :mod:`.shares`),
    and the workers' share (``worker_gpu_share``) and own SM time (``worker_utilization_gpu``)."""
    job = store.check_job(job)
    have = store.fields().get(schema.GPU, ())
    if UTIL not in have:
        return _empty(GPU, store.kept(schema.GPU, UTIL) or NO_GPU)
    fields = [f for f in (UTIL, *GPM, *PER_WORKER) if f in have]
    # every sample, not the job's only: a sample stands for the window before it, from the previous one of its GPU
    frames = [store.backend.frame(schema.GPU, fields, w).assign(worker=w) for w in store.workers()]
    samples = pd.concat([_timed(f) for f in frames if not f.empty] or [frames[0]], ignore_index=True)
    samples = shares.own(samples, ["worker", "index"])
    if missing := shares.unknown(samples):
        store.skip_note(shares.unknown_note(missing))
    dags = store.dags()
    return _only(gpu_during(samples, dict(zip(dags["dag"], dags["job"]))), job)


def gpu_per_prefix(store: Store, job: Optional[int] = None, per_dag: bool = False) -> pd.DataFrame:
    """Was the GPU busy during each task prefix's tasks: per job (and DAG) and prefix, the mean utilization
    (and GPM's SM active, occupancy, tensor activity where collected) over the tasks' time on their workers'
    own GPUs, the job's own and the device's (:mod:`.shares`), and the worker's GPU memory delta across
    them; see :func:`prefix_gpu`."""
    stream = task_stream(store, job)
    columns = PREFIX_GPU if per_dag else [c for c in PREFIX_GPU if c != "dag"]
    if stream.empty:
        return _empty(columns, stream.attrs.get("why", NO_TASK_STREAM))
    # every sample of every GPU, not the job's only: a reading stands for the window before it
    samples = store.backend.points(schema.GPU, ["worker", "index", "uuid", *PREFIX_DEVICE, MEMORY, shares.SHARE])
    out = prefix_gpu(stream, samples, per_dag=per_dag)
    if out.attrs.get("why") == NO_GPU_SAMPLES and (kept := store.kept(schema.GPU, UTIL)):
        out.attrs["why"] = kept
    if missing := out.attrs.pop("unknown", 0):
        store.skip_note(shares.unknown_note(missing))
    return _only(out, job)
