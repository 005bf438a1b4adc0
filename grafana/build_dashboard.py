"""Build ``grafana/dashboards/dask-influx-metrics.json`` and the alert rules from the data contract.

Every measurement, field and unit comes from :mod:`dask_influx_metrics.schema`,
so a renamed field breaks this script (and its test), not a dashboard in
production. It also writes the example alert rules
(``grafana/provisioning/alerting/dask-alerts.yaml``). Run it after changing the
schema and commit the output::

    .venv/bin/python grafana/build_dashboard.py

Queries are InfluxQL against the ``dask-influxql`` datasource (InfluxDB 1.x,
or 2.x through a DBRP mapping). ``host``/``worker`` filter with
``=~ /^$var$/``; ``job``/``dag`` tags of samples are comma-joined lists
(``"1,2"``), so they filter with ``=~ /(^|,)$var(,|$)/`` (:mod:`dask_influx_metrics.jobtags`).
Every query works whether ``dag`` is a tag or a field (``dag-tag: false``): it
filters on ``dag`` but never groups by it, and the ``dag`` points hold
``dag``/``status`` as fields.
"""

from __future__ import annotations

import json
import os
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dask_influx_metrics import jobtags, schema  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "dashboards", "dask-influx-metrics.json")
ALERTS_OUT = os.path.join(HERE, "provisioning", "alerting", "dask-alerts.yaml")
UID = "dask-influx-metrics"
INFLUXQL = {"type": "influxdb", "uid": "dask-influxql"}
UNITS = {
    "%": "percent",
    "MiB": "decmbytes",
    "bytes": "bytes",
    "W": "watt",
    "C": "celsius",
    "MHz": "rothz",
    "count": "short",
    "s": "s",
    "bytes/s": "Bps",
    "mJ": "short",
}

HOST_WORKER = '"host" =~ /^$host$/ AND "worker" =~ /^$worker$/'
JOB = f'"job" =~ {jobtags.influxql_regex("$job")}'  # activity points have no dag
JOB_DAG = f'{JOB} AND "dag" =~ {jobtags.influxql_regex("$dag")}'
SAMPLES = f"{HOST_WORKER} AND {JOB_DAG}"
BUSY = "\"dag\" != '0'"
PER_GPU, GPU_ALIAS = ["worker", "index"], "$tag_worker GPU $tag_index"
# Clock-event reasons that mean the GPU was slowed down (idle, application/display clocks and
# sync boost are not shown).
SLOWDOWNS = (0x4, 0x8, 0x20, 0x40, 0x80)
HELD_IDLE_MINUTES = 10  # the example alert: a GPU held idle by a running job this long
LOSS_MINUTES = 5  # the example alert: points dropped or refused within this window


def field(measurement: str, name: str) -> schema.Field:
    """The schema entry (raises ``KeyError`` for a name the contract lacks)."""
    return schema.FIELDS[measurement, name]


def unit(f: schema.Field) -> str:
    return UNITS.get(f.unit, "short")


def variable(name: str, query: str, regex_all: bool = False) -> dict:
    """A multi-value query variable on the InfluxQL datasource."""
    var = {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": INFLUXQL,
        "query": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "sort": 3 if regex_all else 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }
    if regex_all:  # job/dag: match any element of a comma-joined list
        var["allValue"] = ".*"
    return var


def held_idle() -> str:
    """Per GPU sample: 1 when the GPU ran no kernel while memory was in use on it, else 0.

    InfluxQL has no CASE: ``ceil(x / big)`` is 1 for any ``0 < x <= big`` and 0 for 0.
    """
    util, mem = field(schema.GPU, "utilization_gpu").name, field(schema.GPU, "memory_used").name
    return f'(1 - ceil("{util}" / 100)) * ceil("{mem}" / 1000000000)'


def target(query: str, alias: str = "", fmt: str = "time_series", ref: str = "A") -> dict:
    out = {"refId": ref, "datasource": INFLUXQL, "rawQuery": True, "resultFormat": fmt, "query": query}
    return {**out, "alias": alias} if alias else out


def graph(
    title: str,
    description: str,
    query: str,
    alias: str,
    panel_unit: str,
    stack: bool = False,
    y_max: float | None = None,
) -> dict:
    """A time series panel from its own InfluxQL; the y axis starts at 0 (and ends at ``y_max``)."""
    custom = {"stacking": {"mode": "normal" if stack else "none"}, "fillOpacity": 20 if stack else 0}
    defaults = {"unit": panel_unit, "min": 0, "custom": custom, **({"max": y_max} if y_max is not None else {})}
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": INFLUXQL,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [target(query, alias)],
    }


def timeseries(
    title: str,
    f: schema.Field,
    agg: str,
    where: str,
    group: list[str],
    alias: str,
    stack: bool = False,
    panel_unit: str | None = None,
) -> dict:
    """A time series of ``agg(field)`` per ``group`` tags (in the field's unit, or Grafana's ``panel_unit``);
    percentages on a 0-100 axis."""
    tags = "".join(f', "{t}"' for t in group)
    query = (
        f'SELECT {agg}("{f.name}") FROM "{f.measurement}" WHERE {where} AND $timeFilter '
        f"GROUP BY time($__interval){tags} fill(none)"
    )
    return graph(title, f.description, query, alias, panel_unit or unit(f), stack, y_max=100 if f.unit == "%" else None)


def table(title: str, description: str, query: str) -> dict:
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": INFLUXQL,
        "fieldConfig": {"defaults": {}, "overrides": []},
        "targets": [target(query, fmt="table")],
    }


def gpu_panels() -> list[list[tuple[dict, int]]]:
    """Rows of per-GPU panels: every collected gpu field, clock-event reasons, held-idle time, GPU-hours."""

    def per_gpu(title: str, name: str, agg: str = "mean") -> tuple[dict, int]:
        return timeseries(title, field(schema.GPU, name), agg, SAMPLES, PER_GPU, GPU_ALIAS), 12

    reasons = field(schema.GPU, "clocks_event_reasons")
    shares = ", ".join(f'100 * mean("r{bit}") AS "{schema.CLOCK_EVENT_REASONS[bit]}"' for bit in SLOWDOWNS)
    bits = ", ".join(f'("{reasons.name}" & {bit}) / {bit} AS "r{bit}"' for bit in SLOWDOWNS)
    slowdowns = (
        f"SELECT {shares} FROM (SELECT {bits} FROM \"{schema.GPU}\" WHERE {SAMPLES} AND $timeFilter) "
        f"WHERE $timeFilter GROUP BY time($__interval), \"worker\", \"index\" fill(none)"
    )
    held = (
        f"SELECT 100 * mean(\"held_idle\") FROM (SELECT {held_idle()} AS \"held_idle\" FROM \"{schema.GPU}\" "
        f"WHERE {SAMPLES} AND {BUSY} AND $timeFilter) WHERE $timeFilter "
        f"GROUP BY time($__interval), \"worker\", \"index\" fill(none)"
    )
    hours = "* $sample_ms / 3600000"
    util = field(schema.GPU, "utilization_gpu").name
    gpu_hours = (
        f'SELECT count("util") {hours} AS "gpu_hours", sum("held_idle") {hours} AS "held_idle_gpu_hours", '
        f'mean("util") AS "mean_{util}" FROM (SELECT "{util}" AS "util", {held_idle()} AS "held_idle" '
        f"FROM \"{schema.GPU}\" WHERE {SAMPLES} AND {BUSY} AND $timeFilter) WHERE $timeFilter GROUP BY \"job\""
    )
    return [
        [
            per_gpu("GPU power draw per worker/GPU", "power_draw"),
            per_gpu("GPU temperature per worker/GPU", "temperature_gpu", "max"),
        ],
        [
            per_gpu("SM clock per worker/GPU", "clocks_current_sm"),
            (
                graph(
                    "Clock-event reasons: % of samples slowed down, per reason",
                    f"{reasons.description}: "
                    "the share of samples in which each slowdown reason was active (NVML bits "
                    + ", ".join(f"{bit:#x} {schema.CLOCK_EVENT_REASONS[bit]}" for bit in SLOWDOWNS)
                    + ").",
                    slowdowns,
                    f"{GPU_ALIAS} $col",
                    "percent",
                    y_max=100,
                ),
                12,
            ),
        ],
        [
            per_gpu("GPU memory held by each worker's processes", "worker_memory_used", "max"),
            per_gpu("GPU memory busy (read/write time)", "utilization_memory"),
        ],
        [
            (
                graph(
                    "GPU held idle while a job runs (% of busy samples)",
                    "Share of the busy samples (a job's task running on a worker using the GPU) in which the GPU "
                    "ran no kernel while memory was in use on it (utilization_gpu = 0, memory_used > 0).",
                    held,
                    GPU_ALIAS,
                    "percent",
                    y_max=100,
                ),
                12,
            ),
            (
                table(
                    "GPU-hours and held-idle GPU-hours per job",
                    "GPU samples while the job ran (busy, dag != '0') x the sampling interval ($sample_ms ms), "
                    "over the GPUs shown; held idle: those in which the GPU ran no kernel while memory was in use. "
                    "A job tag such as '1,2' means the jobs shared the GPU's workers at that time.",
                    gpu_hours,
                ),
                12,
            ),
        ],
    ]


def delivery_panels() -> list[list[tuple[dict, int]]]:
    """Sampling health: each sender's sink counters (cumulative), as rates and as totals over the range."""
    senders = '"host", "worker", "sink"'
    sent, dropped, refused, spooled, errors = schema.DELIVERY_FIELDS

    def rates(*names: str) -> str:
        cols = ", ".join(f'non_negative_derivative(last("{n}"), 1s) AS "{n}"' for n in names)
        return (
            f'SELECT {cols} FROM "{schema.DELIVERY}" WHERE $timeFilter GROUP BY time($__interval), {senders} fill(none)'
        )

    increases = ", ".join(f'non_negative_difference("{n}") AS "{n}"' for n in schema.DELIVERY_FIELDS)
    sums = ", ".join(f'sum("{n}") AS "{n}"' for n in schema.DELIVERY_FIELDS)
    totals = (
        f'SELECT {sums} FROM (SELECT {increases} FROM "{schema.DELIVERY}" WHERE $timeFilter GROUP BY {senders}) '
        f"WHERE $timeFilter GROUP BY {senders}"
    )
    every = "Every sender (worker, agent or scheduler, whatever the host/worker selection), per sink; "
    return [
        [
            (
                graph(
                    "Points sent per second, per sender and sink",
                    every + "from its cumulative points_sent.",
                    rates(sent),
                    "$tag_host $tag_worker $tag_sink",
                    "cps",
                ),
                12,
            ),
            (
                graph(
                    "Points dropped, refused, spooled and sink errors per second",
                    every + "dropped: lost before sending (queue full); refused: the server said no; spooled: kept on "
                    "disk for replay; errors: failed sends.",
                    rates(dropped, refused, spooled, errors),
                    "$tag_worker $tag_sink $col",
                    "cps",
                ),
                12,
            ),
        ],
        [
            (
                table(
                    "Sampling health: points per sender and sink in the time range",
                    every + "each counter's increase within the range (a sender restart resets its counters; the "
                    "step across a reset is left out).",
                    totals,
                ),
                24,
            )
        ],
    ]


def several(
    title: str, names: tuple, agg: str = "mean", group: tuple = ("worker", "index"), where: str = SAMPLES
) -> tuple[dict, int]:
    """One panel of several gpu fields of one unit, one line per field and GPU (or ``group``)."""
    fields = [field(schema.GPU, n) for n in names]
    select = ", ".join(f'{agg}("{f.name}") AS "{f.name}"' for f in fields)
    tags = "".join(f', "{t}"' for t in group)
    query = (
        f'SELECT {select} FROM "{schema.GPU}" WHERE {where} AND $timeFilter GROUP BY time($__interval){tags} fill(none)'
    )
    description = "; ".join(f"{f.name}: {f.description}" for f in fields)
    alias = (
        "$tag_worker " + ("GPU $tag_index " if "index" in group else "") + ("job $tag_job " if "job" in group else "")
    )
    return graph(
        title, description, query, alias + "$col", unit(fields[0]), y_max=100 if fields[0].unit == "%" else None
    ), 12


def depth_panels() -> list[list[tuple[dict, int]]]:
    """Why the GPU was slow and whose work it was: GPM (Hopper+), per-worker shares, the Telegraf extras."""
    return [
        [
            several(
                "Was the GPU busy? utilization vs SM active vs occupancy vs tensor vs DRAM (GPM)",
                ("utilization_gpu", "sm_active", "sm_occupancy", "pipe_tensor_active", "dram_active"),
            ),
            several(
                "Each worker's share of a shared GPU (SM and memory-controller time)",
                ("worker_utilization_gpu", "worker_utilization_memory"),
                group=("worker", "index", "job"),
            ),
        ],
        [
            several(
                "Pipes active (GPM)",
                (
                    "gr_engine_active",
                    "pipe_tensor_hmma_active",
                    "pipe_tensor_imma_active",
                    "pipe_tensor_dfma_active",
                    "pipe_tensor_dmma_active",
                    "pipe_fp64_active",
                    "pipe_fp32_active",
                    "pipe_fp16_active",
                    "pipe_int_active",
                ),
            ),
            several(
                "PCIe and NVLink traffic (GPM)",
                ("pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes"),
            ),
        ],
        [
            several(
                "Video engines busy",
                ("utilization_encoder", "utilization_decoder", "utilization_jpeg", "utilization_ofa"),
            ),
            several("Memory clock", ("clocks_current_memory",)),
        ],
        [
            several("Performance state (0 = P0, fastest)", ("pstate",), agg="max"),
            several("Fan speed", ("fan_speed",), agg="max"),
        ],
        [
            several("Energy used since the driver loaded (mJ)", ("total_energy_consumption",), agg="max"),
            several(
                "ECC errors (counters)",
                (
                    "ecc_errors_volatile_correctable",
                    "ecc_errors_volatile_uncorrectable",
                    "ecc_errors_aggregate_correctable",
                    "ecc_errors_aggregate_uncorrectable",
                ),
                agg="max",
            ),
        ],
    ]


def panels() -> list[dict]:
    gpu_util = field(schema.GPU, "utilization_gpu")
    gpu_mem = field(schema.GPU, "memory_used")
    gpu_mem_pct = field(schema.GPU, "memory_used_percent")
    host_cpu = field(schema.HOST, "cpu_percent")
    host_mem = field(schema.HOST, "memory_used_percent")
    tasks = field(schema.WORKER, "tasks")
    rss = field(schema.WORKER, "rss")
    duration = field(schema.DAG, "duration")
    peak = (
        f'SELECT max("{gpu_mem.name}") AS "peak_{gpu_mem.name}_mib", '
        f'max("{gpu_mem_pct.name}") AS "peak_{gpu_mem_pct.name}", '
        f'mean("{gpu_util.name}") AS "mean_{gpu_util.name}" '
        f"FROM \"{schema.GPU}\" WHERE {SAMPLES} AND {BUSY} AND $timeFilter GROUP BY \"job\""
    )
    dags = (
        f'SELECT "{field(schema.DAG, "dag").name}", "{field(schema.DAG, "status").name}", "{duration.name}", '
        f'"{field(schema.DAG, "tasks").name}", "{field(schema.DAG, "label").name}" '
        f"FROM \"{schema.DAG}\" WHERE \"job\" =~ /^$job$/ AND \"dag\" =~ /^$dag$/ "
        f"AND \"event\" = 'end' AND $timeFilter GROUP BY \"job\""
    )
    rows = [
        [
            (timeseries("GPU utilization per worker/GPU", gpu_util, "mean", SAMPLES, PER_GPU, GPU_ALIAS), 12),
            (timeseries("GPU memory used per worker/GPU", gpu_mem, "max", SAMPLES, PER_GPU, GPU_ALIAS), 12),
        ],
        [
            (timeseries("GPU memory used (% of capacity)", gpu_mem_pct, "max", SAMPLES, PER_GPU, GPU_ALIAS), 12),
            (
                table(
                    "Peak GPU memory per job",
                    "Busy samples only (dag != '0'); a job tag such as '1,2' "
                    "means the jobs shared the worker at that time.",
                    peak,
                ),
                12,
            ),
        ],
        *gpu_panels(),
        *depth_panels(),
        [
            (timeseries("Running tasks per worker", tasks, "max", SAMPLES, ["worker"], "$tag_worker", stack=True), 12),
            (timeseries("Worker memory (RSS)", rss, "max", SAMPLES, ["worker"], "$tag_worker"), 12),
        ],
        [
            (timeseries("Host CPU", host_cpu, "mean", '"host" =~ /^$host$/', ["host"], "$tag_host"), 12),
            (timeseries("Host memory used", host_mem, "mean", '"host" =~ /^$host$/', ["host"], "$tag_host"), 12),
        ],
        [(table("DAGs (ended)", "One row per DAG that ended in the time range.", dags), 24)],
        [
            (
                timeseries(
                    "Task throughput per job (tasks finished per interval)",
                    field(schema.TASK, "duration"),
                    "count",
                    SAMPLES,
                    ["job"],
                    "job $tag_job",
                    stack=True,
                    panel_unit="short",
                ),
                12,
            ),
            (
                timeseries(
                    "Worker time per job and activity (s, Dask fine performance metrics)",
                    field(schema.ACTIVITY, "value"),
                    "sum",
                    f"{HOST_WORKER} AND {JOB} AND \"unit\" = 'seconds'",
                    ["job", "activity"],
                    "job $tag_job $tag_activity",
                    stack=True,
                    panel_unit="s",
                ),
                12,
            ),
        ],
        *delivery_panels(),
    ]
    out, panel_id = [], 1
    for y, row in enumerate(rows):
        x = 0
        for panel, width in row:
            out.append({"id": panel_id, "gridPos": {"x": x, "y": y * 8, "w": width, "h": 8}, **panel})
            panel_id, x = panel_id + 1, x + width
    return out


def sample_ms() -> dict:
    """The sampling interval (ms) for GPU-hours: the median step between a GPU's samples in the range
    (as ``db.summary()`` takes it); a single value, so Grafana inserts it as a plain number."""
    util = field(schema.GPU, "utilization_gpu").name
    query = (
        f'SELECT round(median("step")) FROM (SELECT elapsed("{util}", 1ms) AS "step" FROM "{schema.GPU}" '
        f'WHERE "host" =~ /^$host$/ AND $timeFilter GROUP BY "host", "worker", "index") WHERE $timeFilter'
    )
    return {
        "name": "sample_ms",
        "label": "sampling interval (ms)",
        "type": "query",
        "datasource": INFLUXQL,
        "query": query,
        "refresh": 2,
        "multi": False,
        "includeAll": False,
        "description": "median time between a GPU's samples in the range; GPU-hours = samples x this",
    }


def dashboard() -> dict:
    tag_values = 'SHOW TAG VALUES FROM "{m}" WITH KEY = "{k}"'
    annotation = (
        f'SELECT "{field(schema.DAG, "event").name}", "{field(schema.DAG, "tasks").name}", '
        f'"job", "dag" FROM "{schema.DAG}" WHERE "job" =~ /^$job$/ AND "dag" =~ /^$dag$/ AND $timeFilter'
    )
    return {
        "uid": UID,
        "title": "Dask: GPUs per job and DAG",
        "tags": ["dask", "gpu"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "timezone": "browser",
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "graphTooltip": 1,
        "templating": {
            "list": [
                variable("host", tag_values.format(m=schema.WORKER, k="host")),
                variable("worker", tag_values.format(m=schema.WORKER, k="worker") + ' WHERE "host" =~ /^$host$/'),
                variable("job", tag_values.format(m=schema.DAG, k="job"), regex_all=True),
                variable(
                    "dag",
                    f'SELECT DISTINCT("{field(schema.DAG, "dag").name}") FROM "{schema.DAG}" '
                    'WHERE "job" =~ /^$job$/ AND $timeFilter',
                    regex_all=True,
                ),
                sample_ms(),
            ]
        },
        "annotations": {
            "list": [
                {
                    "name": "DAG boundaries",
                    "datasource": INFLUXQL,
                    "enable": True,
                    "iconColor": "rgba(255, 96, 96, 1)",
                    "target": {
                        "refId": "Anno",
                        "query": annotation,
                        "rawQuery": True,
                        "fromAnnotations": True,
                        "textColumn": "event",
                        "tagsColumn": "job,dag",
                    },
                },
            ]
        },
        "panels": panels(),
    }


# --- alert rules (Grafana unified alerting, file provisioning) --------------------------------
EXPR = {"type": "__expr__", "uid": "__expr__"}


def alert_query(ref: str, query: str, seconds: int) -> dict:
    """An InfluxQL query of a rule over the last ``seconds`` (Grafana fills ``$timeFilter`` from the range)."""
    return {
        "refId": ref,
        "relativeTimeRange": {"from": seconds, "to": 0},
        "datasourceUid": INFLUXQL["uid"],
        "model": {
            "refId": ref,
            "datasource": dict(INFLUXQL),
            "rawQuery": True,
            "query": query,
            "resultFormat": "time_series",
            "intervalMs": 1000,
            "maxDataPoints": 43200,
        },
    }


def expression(ref: str, **model) -> dict:
    """A server-side expression (reduce, math, threshold) of a rule."""
    return {"refId": ref, "datasourceUid": EXPR["uid"], "model": {"refId": ref, "datasource": dict(EXPR), **model}}


def reduce_last(ref: str, of: str) -> dict:
    return expression(ref, type="reduce", expression=of, reducer="last", settings={"mode": "dropNN"})


def panel_id(title: str) -> int:
    (found,) = [p["id"] for p in panels() if p["title"] == title]
    return found


def rule(uid: str, title: str, condition: str, data: list[dict], panel: str, summary: str, description: str) -> dict:
    return {
        "uid": uid,
        "title": title,
        "condition": condition,
        "data": data,
        "dashboardUid": UID,
        "panelId": panel_id(panel),
        "noDataState": "OK",
        "execErrState": "Error",
        "for": "0s",
        "isPaused": False,
        "labels": {"source": "dask-influx-metrics"},
        "annotations": {"summary": summary, "description": description},
    }


def held_idle_rule() -> dict:
    """A GPU whose every sample in the window is busy (a job's task running on a worker using it) with
    memory in use, and none ran a kernel: one alert per GPU (host, uuid)."""
    util, mem = field(schema.GPU, "utilization_gpu").name, field(schema.GPU, "memory_used").name
    seconds = HELD_IDLE_MINUTES * 60
    every = f'FROM "{schema.GPU}" WHERE $timeFilter GROUP BY "host", "uuid"'
    held = f'FROM "{schema.GPU}" WHERE {BUSY} AND "{mem}" > 0 AND $timeFilter GROUP BY "host", "uuid"'
    data = [
        alert_query("A", f'SELECT max("{util}") {every}', seconds),
        alert_query("B", f'SELECT count("{util}") {held}', seconds),
        alert_query("C", f'SELECT count("{util}") {every}', seconds),
        reduce_last("D", "A"),
        reduce_last("E", "B"),
        reduce_last("F", "C"),
        # max utilization 0, and every sample busy with memory in use
        expression("G", type="math", expression="$D == 0 && $E == $F"),
    ]
    return rule(
        "dask-gpu-held-idle",
        f"GPU held idle by a running job for {HELD_IDLE_MINUTES} minutes",
        "G",
        data,
        "GPU held idle while a job runs (% of busy samples)",
        "GPU {{ $labels.uuid }} on {{ $labels.host }} ran no kernel for "
        f"{HELD_IDLE_MINUTES} minutes while a job held it",
        f"In each of the last {HELD_IDLE_MINUTES} minutes' samples a job's task ran on a worker using "
        "this GPU, with memory in use on it, and utilization_gpu was 0. The dashboard's job "
        "variable and GPU-hours table show which job.",
    )


def dropped_rule() -> dict:
    """Points dropped or refused by any sender's sink within the window: one alert per sender and sink."""
    dropped, refused = schema.DELIVERY_FIELDS[1:3]
    senders = '"host", "worker", "sink"'
    lost = (
        f'SELECT sum("{dropped}") + sum("{refused}") AS "lost" FROM (SELECT '
        f'non_negative_difference("{dropped}") AS "{dropped}", non_negative_difference("{refused}") AS "{refused}" '
        f'FROM "{schema.DELIVERY}" WHERE $timeFilter GROUP BY {senders}) WHERE $timeFilter GROUP BY {senders}'
    )
    data = [
        alert_query("A", lost, LOSS_MINUTES * 60),
        reduce_last("B", "A"),
        expression("C", type="threshold", expression="B", conditions=[{"evaluator": {"type": "gt", "params": [0]}}]),
    ]
    return rule(
        "dask-samples-dropped",
        "Samples dropped",
        "C",
        data,
        "Points dropped, refused, spooled and sink errors per second",
        "{{ $labels.worker }} on {{ $labels.host }} lost samples ({{ $labels.sink }} sink)",
        f"Points dropped (not sent) or refused (by the server) in the last {LOSS_MINUTES} minutes, from "
        f"the sender's {schema.DELIVERY} counters; those samples are missing from every query.",
    )


def alerts() -> dict:
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": "dask-influx-metrics",
                "folder": "Dask",
                "interval": "1m",
                "rules": [held_idle_rule(), dropped_rule()],
            }
        ],
    }


def write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(path)


def main() -> None:
    write(OUT, json.dumps(dashboard(), indent=2) + "\n")
    write(
        ALERTS_OUT,
        "# Generated by grafana/build_dashboard.py: example alert rules (Grafana unified alerting).\n"
        + yaml.safe_dump(alerts(), sort_keys=False, width=120),
    )


if __name__ == "__main__":
    main()
