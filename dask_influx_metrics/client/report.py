"""The one-file HTML report: ``query.report(db, path)``, ``Monitor.report(path)``, ``dask-influx-metrics report``.

One self-contained file (BokehJS, CSS and data inline; nothing is fetched when it is opened):
a session overview (source, time range, workers, GPUs, one row per job: DAGs, tasks, GPU
utilization while its tasks ran (its own, and the device's), device-hours, unused and held-but-idle
GPU-hours, each physical GPU counted once), then per
job its DAGs, GPU utilization and memory timelines per worker and GPU with the job's busy
intervals shaded, peaks, utilization summary per worker, GPU use per DAG, the activity
breakdown (Dask's fine performance metrics) and the slowest task prefixes. "Was the GPU busy": per
job and DAG, then per task prefix; one table per node of its CPU (with the spread across cores), memory,
disk and network, for the session and each job. "GPU accounting": the sampling agents' running totals per
job and GPU (busy and SM-active GPU-seconds, energy, memory, CPU; :mod:`.accounting`). A section without
data says why. Figures: :mod:`.reportfigs`; the numbers: :mod:`.summary`, :mod:`.peaks`, :mod:`.tasks`.
"""

from __future__ import annotations

import datetime as _dt
import html
import os

import pandas as pd

from . import reportfigs as figs
from . import summary as _summary
from . import tasks as _tasks
from .accounting import accounting
from .peaks import peaks as read_peaks
from .query.metricnames import MIB
from .query.store import Store
from .tables import device_columns, not_recorded, worker_tables

GIB = 2.0**30
TIMELINES = {"compute-util": ("GPU utilization (%)", 1.0), "total-mem": ("GPU memory used (GiB)", GIB)}
NO_GPU = not_recorded("GPU samples", list(TIMELINES), "the workers saw no GPU")
NO_UTILIZATION = not_recorded("utilization", ["compute-util", "host-cpu"], "no sample counted for this job")
SUMMARY_COLUMNS = [
    "worker_index",
    "resource",
    "devices",
    "samples",
    "mean",
    "max",
    "above_40",
    "device_hours",
    "unused_device_hours",
    "held_idle_device_hours",
]
ACCOUNTING = (
    "GPU accounting: the sampling agents' running totals per job and GPU (busy, SM-active and tensor-active "
    "GPU-seconds: the job's own; energy; its workers' GPU memory; CPU seconds), per job (host all) and the idle "
    "rows (no job's)"
)
# The node tables (one per node): its cpu, memory, disk and network rows; bytes shown in MiB.
NODE_RESOURCES = ("cpu", "memory", "disk", "network")
NODE_COLUMNS = [
    "resource",
    "samples",
    "hours",
    "mean",
    "max",
    "above_80",
    "core_max",
    "core_min",
    "devices",
    "device_hours",
    "unused_device_hours",
    *_summary.COUNTERS["disk"],
    *_summary.COUNTERS["network"],
]
NODE_HEADING = (
    "one table per node; % of the node (cpu: mean over all cores = 100, core_max / core_min: the highest "
    "reading of the busiest / idlest core, % of one core; devices: cores, device_hours: CPU core-hours; disk: "
    "the fullest of the workers' filesystems), MiB read, written, sent and received in the windows counted"
)
SLOWEST = 10
TOP_ACTIVITIES = 10  # per job: the activities that took the most time; the rest folded below them
BUSIEST = 15  # task prefixes per job in "was the GPU busy", most GPU-covered task time first
STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #2ca02c;padding-bottom:.2em;margin-top:2em}
h3{margin:1.2em 0 .4em}p.scope{color:#555;margin-top:0}p.why{color:#8a6d3b;background:#fcf8e3;padding:.4em .8em}
table.data{border-collapse:collapse;font-size:.85em;margin:.4em 0;max-width:100%}
table.data th,table.data td{border-bottom:1px solid #ddd;padding:.2em .6em;text-align:right;overflow-wrap:break-word}
table.data th{background:#f4f4f4;vertical-align:bottom}nav a{margin-right:1em}
details{margin:.2em 0 .8em}details summary{cursor:pointer;color:#555}
"""


def _text(s) -> str:
    return html.escape(str(s))


def _why(reason: str) -> str:
    return f'<p class="why">{_text(reason)}</p>'


def _table(frame: pd.DataFrame, why: str = "") -> str:
    if frame is None or frame.empty:
        return _why(why or (frame.attrs.get("why", "no rows") if frame is not None else "no rows"))
    times = {
        c: frame[c].dt.strftime("%Y-%m-%d %H:%M:%S")
        for c in frame.columns
        if isinstance(frame[c].dtype, pd.DatetimeTZDtype)
    }
    text = frame.assign(**times).to_html(
        index=False, border=0, classes="data", na_rep="-", float_format=lambda v: f"{v:.4g}"
    )
    head, end, rest = text.partition("</thead>")  # a long column name wraps at its underscores: fits 1400 px
    return head.replace("_", "_<wbr>") + end + rest


def _attempt(fn, *args, **kw):
    """``fn(...)``, or an empty frame whose ``why`` is the error (a metric not collected, ...)."""
    try:
        return fn(*args, **kw)
    except ValueError as e:
        frame = pd.DataFrame()
        frame.attrs["why"] = str(e)
        return frame


def collect(db: Store) -> dict:
    """Everything the report shows, read once from ``db``."""
    metrics = db.metrics()
    wanted = [m for m in (*TIMELINES, _summary.CPU_METRIC, *_summary.MEMORY_METRICS) if m in metrics]
    tables = worker_tables(db, metrics=list(dict.fromkeys(wanted))) if wanted else {}
    has_util = {_summary.GPU_METRIC, _summary.CPU_METRIC} & set(wanted)
    peaks = [_attempt(read_peaks, db, m) for m in TIMELINES if m in metrics]
    return {
        "scope": db.scope(),
        "notes": db.notes,
        "workers": db.worker_map(),
        "jobs": db.jobs(),
        "first": db.backend.first_time(),
        "last": db.backend.last_time(),
        "dags": db.dags(),
        "gpus": _attempt(db.gpus) if "gpu" in db.fields() else pd.DataFrame(),
        "tables": tables,
        "summary": _summary.summarize(list(tables.values()), hosts=_summary.node_tables(db, list(tables)))
        if has_util
        else pd.DataFrame(),
        "peaks": pd.concat([p for p in peaks if not p.empty]) if any(not p.empty for p in peaks) else pd.DataFrame(),
        "tasks": _tasks.tasks(db),
        "activity": _tasks.activity(db),
        "gpu": _tasks.gpu_during_tasks(db),
        "prefix_gpu": _tasks.gpu_per_prefix(db),
        "accounting": _attempt(accounting, db),
    }


def _when(ns) -> str:
    return "-" if ns is None else pd.Timestamp(int(ns), unit="ns", tz="UTC").strftime("%Y-%m-%d %H:%M:%S UTC")


def _gpu_hours(summary: pd.DataFrame, job) -> dict:
    """GPU-hours of the session (or of ``job``): the summary's row that counts each physical GPU once (workers
    sharing a GPU each see all of it); NaN without one."""
    cols = ("device_hours", "unused_device_hours", "held_idle_device_hours")
    if summary.empty:
        return {c: float("nan") for c in cols}
    every = (summary["resource"] == "gpu") & (summary["worker"] == _summary.ALL)
    rows = summary[every & (summary["job"].isna() if job is None else summary["job"] == job)]
    return {c: float(rows[c].iloc[0]) if len(rows) else float("nan") for c in cols}


def job_overview(data: dict) -> pd.DataFrame:
    """One row per job: DAGs (by status), tasks, first submission, wall time, GPU use while busy, GPU-hours."""
    dags, gpu, tasks = data["dags"], data["gpu"], data["tasks"]
    rows = []
    for job in data["jobs"]:
        mine = dags[dags["job"] == job] if not dags.empty else dags
        util = gpu[(gpu["job"] == job) & gpu["dag"].isna()] if not gpu.empty else gpu
        row = {
            "job": job,
            "dags": len(mine),
            "status": ", ".join(f"{n} {s}" for s, n in mine["status"].value_counts().items()) if len(mine) else "-",
            "tasks": int(mine["tasks"].sum()) if len(mine) else float("nan"),
            "tasks_finished": int(tasks.loc[tasks["job"] == job, "tasks"].sum()) if not tasks.empty else float("nan"),
            "submitted": mine["submitted"].min() if len(mine) else pd.NaT,
            "wall_s": (mine["ended"].max() - mine["submitted"].min()).total_seconds() if len(mine) else float("nan"),
            "gpu_util_while_busy": float(util["mean_utilization_gpu"].iloc[0]) if len(util) else float("nan"),
            "device_util_while_busy": float(util["mean_device_utilization_gpu"].iloc[0])
            if len(util) and "mean_device_utilization_gpu" in util
            else float("nan"),
        }
        rows.append({**row, **_gpu_hours(data["summary"], job)})
    return pd.DataFrame(rows)


def _overview(data: dict) -> str:
    parts = ["<h2 id=\"overview\">Session overview</h2>", "<table class=\"data\">"]
    hours = _gpu_hours(data["summary"], None)
    facts = [
        ("source", data["scope"]),
        ("samples from", _when(data["first"])),
        ("to", _when(data["last"])),
        ("workers", len(data["workers"])),
        ("GPUs (worker, uuid)", len(data["gpus"])),
        ("physical GPUs", data["gpus"][["host", "uuid"]].drop_duplicates().shape[0] if len(data["gpus"]) else 0),
        ("jobs", ", ".join(map(str, data["jobs"])) or "-"),
        ("DAGs", len(data["dags"])),
        ("tasks finished (task stream)", int(data["tasks"]["tasks"].sum()) if not data["tasks"].empty else "-"),
        ("GPU device-hours (each physical GPU once)", f"{hours['device_hours']:.4g}"),
        ("unused GPU-hours", f"{hours['unused_device_hours']:.4g}"),
        ("held-but-idle GPU-hours", f"{hours['held_idle_device_hours']:.4g}"),
    ]
    parts += [f"<tr><th>{_text(k)}</th><td style=\"text-align:left\">{_text(v)}</td></tr>" for k, v in facts]
    parts.append("</table><h3>Jobs</h3>" + _table(job_overview(data), "no job ran: no busy samples"))
    parts.append(f"<h3 id=\"accounting\">{ACCOUNTING}</h3>" + _table(_accounting(data["accounting"])))
    parts.append("<h3>Workers</h3>" + _table(pd.DataFrame(list(data["workers"].items()), columns=["index", "address"])))
    if not data["gpus"].empty:
        parts.append("<h3>GPUs</h3>" + _table(data["gpus"]))
    parts.append(f"<h3>Nodes ({NODE_HEADING})</h3>" + _nodes(data["summary"], None))
    parts += [_why("note: " + n) for n in data["notes"]]
    return "\n".join(parts)


def _accounting(frame: pd.DataFrame, job=None) -> pd.DataFrame:
    """The accounting rows for reading (of ``job``): idle and total rows named, memory in GiB, energy in Wh."""
    if frame.empty:
        return frame
    if job is not None:
        frame = frame[frame["job"] == job]
    out = frame.assign(
        job=frame["job"].astype("string").fillna("idle"),
        host=frame["host"].astype("string").fillna("all"),
        uuid=frame["uuid"].astype("string").fillna("-"),
        energy_wh=frame["energy_joules"] / 3600.0,
        memory_peak_gib=frame["memory_peak_bytes"] / GIB,
        memory_mean_gib=frame["memory_mean_bytes"] / GIB,
    )
    columns = ["job", "host", "uuid", "gpu_seconds", "busy_seconds", "sm_active_seconds", "tensor_active_seconds"]
    columns += ["energy_wh", "memory_peak_gib", "memory_mean_gib", "cpu_seconds"]
    return out[[c for c in columns if out[c].notna().any() or c in ("job", "host", "uuid")]]


def node_tables(summary: pd.DataFrame, job) -> dict[str, pd.DataFrame]:
    """``{node: table}``: the node rows of ``job`` (None: the whole session), one row per resource, the
    columns with a figure, bytes in MiB (every worker of a node holds its node's rows: the first's are shown)."""
    if summary.empty or "host" not in summary:
        return {}
    rows = summary[summary["resource"].isin(NODE_RESOURCES) & summary["host"].notna()]
    rows = rows[rows["job"].isna() if job is None else rows["job"] == job]
    out = {}
    for host, part in rows.groupby("host", sort=True):
        part = part[part["worker"] == part["worker"].iloc[0]][NODE_COLUMNS].dropna(axis=1, how="all")
        counted = [c for c in part.columns if c.endswith("_bytes")]
        part = part.assign(**{c: part[c] / MIB for c in counted}).rename(columns={c: c[:-6] + "_MiB" for c in counted})
        out[host] = part
    return out


def _nodes(summary: pd.DataFrame, job) -> str:
    tables = node_tables(summary, job)
    if not tables:
        return _why(not_recorded("host readings", ["host-cpu", "host-mem", "disk-io"], "none counted for this job"))
    return "\n".join(f"<h4>node {_text(host)}</h4>" + _table(table) for host, table in tables.items())


def _peaks(frame: pd.DataFrame, job: int) -> pd.DataFrame:
    if frame.empty:
        return frame
    mine = frame[frame["job"] == job]
    scaled = mine.assign(
        peak=mine["peak"] / mine["unit"].map({"bytes": GIB, "MiB": GIB / MIB}).fillna(1.0),
        metric=mine["metric"].map(lambda m: TIMELINES.get(m, (m,))[0].replace("used", "peak")),
    )
    out = scaled.pivot_table(index=["worker_index", "device"], columns="metric", values="peak").reset_index()
    out.columns.name = None
    return out


def _of_job(frame: pd.DataFrame, job: int) -> pd.DataFrame:
    """The job's rows; an empty frame keeps its ``why``."""
    return frame[frame["job"] == job] if not frame.empty else frame


def _job(data: dict, job: int, figures: dict) -> str:
    dags, tables = data["dags"], data["tables"]
    parts = [
        f'<h2 id="job-{job}">Job {job}</h2>',
        "<h3>DAGs</h3>",
        _table(
            dags[dags["job"] == job] if not dags.empty else dags, "no dag points: the scheduler wrote none in range"
        ),
    ]
    parts.append("<h3>GPU utilization and memory (busy intervals of this job shaded)</h3>")
    x_range = None
    for metric, (label, _) in TIMELINES.items():
        if any(device_columns(t, metric) for t in tables.values()):
            fig = figs.timeline(tables, data["timelines"], job, metric, label, x_range)
            x_range = x_range or fig.x_range
            figures[f"job{job}-{metric}"] = fig
            parts.append(f"{{{{job{job}-{metric}}}}}")
    if x_range is None:
        parts.append(_why(NO_GPU))
    summary = data["summary"]
    mine = _of_job(summary, job)
    parts += [
        "<h3>GPU accounting (the agents' running totals)</h3>",
        _table(_accounting(data["accounting"], job), data["accounting"].attrs.get("why", "no accounting rows")),
        "<h3>Peaks</h3>",
        _table(_peaks(data["peaks"], job), NO_GPU),
        "<h3>Utilization while the job ran (per worker: its own view of each GPU it uses; worker '-': all "
        "workers, each physical GPU once)</h3>",
        _table(
            mine.loc[mine["resource"].isin(["gpu", "cpu"]), SUMMARY_COLUMNS] if not mine.empty else mine, NO_UTILIZATION
        ),
        f"<h3>Node resources while the job ran ({NODE_HEADING})</h3>",
        _nodes(summary, job),
        "<h3>Was the GPU busy? Utilization, and where collected SM active, SM occupancy, tensor and DRAM activity, "
        "during its tasks (job, then each DAG): the job's own (on a shared GPU, scaled by its workers' share of "
        "the GPU's kernel time, worker_gpu_share), and the whole device's (device_: every process on it)</h3>",
        _table(_of_job(data["gpu"], job)),
        f"<h4>Per task prefix (the readings during its tasks on each worker's own GPU, the job's own and the "
        f"device's; GPU memory delta across a task, in MiB; top {BUSIEST} by gpu_s)</h4>",
        _table(
            _of_job(data["prefix_gpu"], job).head(BUSIEST),
            data["prefix_gpu"].attrs.get("why", "no task of this job finished in range"),
        ),
    ]
    parts.append(_activity(_of_job(data["activity"], job), job, figures, data["activity"].attrs.get("why")))
    tasks = data["tasks"]
    mine = _of_job(tasks, job).head(SLOWEST)
    parts += [
        f"<h3>Slowest task prefixes (by total execution time, top {SLOWEST})</h3>",
        _table(mine, data["tasks"].attrs.get("why", "no task of this job finished in range")),
    ]
    return "\n".join(parts)


def _activity(mine: pd.DataFrame, job: int, figures: dict, why) -> str:
    """Where the job's worker time went: the :data:`TOP_ACTIVITIES` that took the most seconds (bars and rows;
    the rest of the seconds as one more bar, so the bars add up), then the rest folded: smaller ones, and
    those Dask counts in other units (bytes, counts)."""
    parts = ["<h3>Where worker time went (Dask fine performance metrics)</h3>"]
    if mine.empty:
        return parts[0] + _table(mine, why or "no activity recorded for this job")
    seconds = mine[mine["unit"] == "seconds"].sort_values("value", ascending=False, kind="stable")
    top, rest = seconds.head(TOP_ACTIVITIES), seconds.iloc[TOP_ACTIVITIES:]
    if not top.empty:
        other = {"prefix": "other", "activity": f"{len(rest)} more", "value": rest["value"].sum()}
        figures[f"job{job}-activity"] = figs.bars(
            pd.concat([top, pd.DataFrame([other])]) if len(rest) else top, job, "seconds"
        )
        parts.append(f"{{{{job{job}-activity}}}}")
    others = mine[mine["unit"] != "seconds"]
    if top.empty:
        top, others = others.head(TOP_ACTIVITIES), others.iloc[TOP_ACTIVITIES:]
    parts.append(_table(top))
    if len(rest) + len(others):
        parts.append(
            f"<details><summary>{len(rest) + len(others)} more row(s): {len(rest)} smaller in seconds, "
            f"{len(others)} in other units (bytes, counts)</summary>{_table(pd.concat([rest, others]))}</details>"
        )
    return "\n".join(parts)


def render(data: dict, title: str) -> str:
    """The report's HTML text."""
    data["timelines"] = figs.timeline_data(data["tables"], {m: d for m, (_, d) in TIMELINES.items()})
    figures: dict = {}
    body = [_overview(data)] + [_job(data, job, figures) for job in data["jobs"]]
    script, divs = figs.embed(figures)
    text = "\n".join(body)
    for name, div in divs.items():
        text = text.replace(f"{{{{{name}}}}}", div)
    nav = " ".join(f'<a href="#job-{j}">job {j}</a>' for j in data["jobs"])
    made = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_text(title)}</title>\n'
        f"<style>{STYLE}</style>\n{figs.resources()}\n</head>\n<body>\n<h1>{_text(title)}</h1>\n"
        f'<p class="scope">{_text(data["scope"])}; written {made} by dask-influx-metrics</p>\n'
        f'<nav><a href="#overview">overview</a> {nav}</nav>\n{text}\n{script}\n</body>\n</html>\n'
    )


def report(db: Store, path, title=None) -> str:
    """Write the report of ``db`` (a Store) to ``path``; returns ``path``. Needs Bokeh ([report] extra)."""
    figs.require_bokeh()
    data = collect(db)
    text = render(data, title or "GPU report: " + ", ".join(f"job {j}" for j in data["jobs"]))
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)
