"""The dashboard's panels and their InfluxQL, every name from the data contract (see build_dashboard.py); the
shared filters and panel makers are in panelkit.py."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from panelkit import (  # noqa: E402
    BUSY,
    DEVICE_ALIAS,
    GPU_ALIAS,
    HOST_WORKER,
    JOB,
    PER_DEVICE,
    PER_GPU,
    SAMPLES,
    SESSION,
    SLOWDOWNS,
    field,
    graph,
    held_idle,
    nested,
    table,
    timeseries,
    unit,
)

from dask_influx_metrics import schema  # noqa: E402


def gpu_panels() -> list[list[tuple[dict, int]]]:
    """Rows of per-GPU panels: every collected gpu field, clock-event reasons, held-idle time, GPU-hours."""

    def per_gpu(title: str, name: str, agg: str = "mean") -> tuple[dict, int]:
        return timeseries(title, field(schema.GPU, name), agg, SAMPLES, PER_DEVICE, DEVICE_ALIAS), 12

    def per_worker(title: str, name: str, agg: str = "mean") -> tuple[dict, int]:
        return timeseries(title, field(schema.GPU, name), agg, SAMPLES, PER_GPU, GPU_ALIAS), 12

    reasons = field(schema.GPU, "clocks_event_reasons")
    shares = ", ".join(f'100 * mean("r{bit}") AS "{schema.CLOCK_EVENT_REASONS[bit]}"' for bit in SLOWDOWNS)
    bits = ", ".join(f'("{reasons.name}" & {bit}) / {bit} AS "r{bit}"' for bit in SLOWDOWNS)
    per_device = 'time($__interval), "host", "uuid" fill(none)'
    slowdowns = nested(shares, bits, SAMPLES, per_device)
    held = nested('100 * mean("held_idle")', f'{held_idle()} AS "held_idle"', f"{SAMPLES} AND {BUSY}", per_device)
    hours = "* $sample_ms / 3600000"
    util = field(schema.GPU, "utilization_gpu").name
    # each physical GPU once per sampling interval: the workers sharing it write a point each
    gpu_hours = (
        f'SELECT count("util") {hours} AS "gpu_hours", sum("held_idle") {hours} AS "held_idle_gpu_hours", '
        f'mean("util") AS "mean_{util}" FROM (SELECT max("{util}") AS "util", max("held_idle") AS "held_idle" '
        f'FROM (SELECT "{util}", {held_idle()} AS "held_idle" FROM "{schema.GPU}" WHERE {SAMPLES} AND {BUSY} '
        f'AND $timeFilter) WHERE $timeFilter GROUP BY time(${{sample_ms:raw}}ms), "host", "uuid", "job") '
        f'WHERE $timeFilter GROUP BY "job"'
    )
    return [
        [
            per_gpu("GPU power draw per GPU", "power_draw"),
            per_gpu("GPU temperature per GPU", "temperature_gpu", "max"),
        ],
        [
            per_gpu("SM clock per GPU", "clocks_current_sm"),
            (
                graph(
                    "Clock-event reasons: % of samples slowed down, per reason",
                    f"{reasons.description}: "
                    "the share of samples in which each slowdown reason was active (NVML bits "
                    + ", ".join(f"{bit:#x} {schema.CLOCK_EVENT_REASONS[bit]}" for bit in SLOWDOWNS)
                    + ").",
                    slowdowns,
                    f"{DEVICE_ALIAS} $col",
                    "percent",
                    y_max=100,
                ),
                12,
            ),
        ],
        [
            per_worker("GPU memory held by each worker's processes", "worker_memory_used", "max"),
            per_gpu("GPU memory busy (read/write time)", "utilization_memory"),
        ],
        [
            (
                graph(
                    "GPU held idle while a job runs (% of busy samples)",
                    "Share of the busy samples (a job's task running on a worker using the GPU) in which the GPU "
                    "ran no kernel while memory was in use on it (utilization_gpu = 0, memory_used > 0).",
                    held,
                    DEVICE_ALIAS,
                    "percent",
                    y_max=100,
                ),
                12,
            ),
            (
                table(
                    "GPU-hours and held-idle GPU-hours per job",
                    "GPU samples while the job ran (busy, dag != '0') x the sampling interval ($sample_ms ms), "
                    "over the GPUs shown, each physical GPU once per interval however many workers share it; "
                    "held idle: those in which the GPU ran no kernel while memory was in use. "
                    "A job tag such as '1,2' means the worker ran tasks of both jobs at that time.",
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
            f'SELECT {cols} FROM "{schema.DELIVERY}" WHERE {SESSION} AND $timeFilter '
            f"GROUP BY time($__interval), {senders} fill(none)"
        )

    increases = ", ".join(f'non_negative_difference("{n}") AS "{n}"' for n in schema.DELIVERY_FIELDS)
    sums = ", ".join(f'sum("{n}") AS "{n}"' for n in schema.DELIVERY_FIELDS)
    totals = (
        f'SELECT {sums} FROM (SELECT {increases} FROM "{schema.DELIVERY}" WHERE {SESSION} AND $timeFilter '
        f"GROUP BY {senders}) WHERE $timeFilter GROUP BY {senders}"
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


def accounting_panel() -> tuple[dict, int]:
    """The agents' per-job totals: each row's last point in the range (it carries the totals so far), added up
    per job (over GPUs, hosts and ``since``: a restarted agent's rows start again from 0)."""
    names = schema.ACCOUNTING_FIELDS
    last = ", ".join(f'last("{n}") AS "{n}"' for n in names)
    totals = ", ".join(
        f'{"max" if n == "memory_peak_bytes" else "sum"}("{n}") AS "{n}"' for n in names if n != "memory_byte_seconds"
    )
    rows = '"host", "worker", "job", "uuid", "since"'
    query = (
        f'SELECT {totals} FROM (SELECT {last} FROM "{schema.ACCOUNTING}" WHERE "host" =~ /^$host$/ AND {JOB} '
        f"AND $timeFilter GROUP BY {rows}) WHERE $timeFilter GROUP BY \"job\""
    )
    return table(
        "GPU accounting per job (the agents' running totals)",
        "Per job (idle: no job's), over its GPUs: time it ran on them (gpu_seconds), its own kernel, SM-active and "
        "tensor-active time (on a shared GPU: its share), its part of the GPUs' energy counters (jobs and idle add "
        "up to the devices'), the most GPU memory its workers held (bytes) and its workers' CPU seconds. Each "
        "point carries the totals so far: a lost point costs nothing.",
        query,
    ), 24


def several(
    title: str, names: tuple, agg: str = "mean", group: tuple = tuple(PER_DEVICE), where: str = SAMPLES
) -> tuple[dict, int]:
    """One panel of several gpu fields of one unit, one line per field and physical GPU (or ``group``)."""
    fields = [field(schema.GPU, n) for n in names]
    select = ", ".join(f'{agg}("{f.name}") AS "{f.name}"' for f in fields)
    tags = "".join(f', "{t}"' for t in group)
    query = (
        f'SELECT {select} FROM "{schema.GPU}" WHERE {where} AND $timeFilter GROUP BY time($__interval){tags} fill(none)'
    )
    description = "; ".join(f"{f.name}: {f.description}" for f in fields)
    alias = (
        ("$tag_worker " if "worker" in group else "")
        + ("GPU $tag_index " if "index" in group else "")
        + ("$tag_host $tag_uuid " if "uuid" in group else "")
        + ("job $tag_job " if "job" in group else "")
    )
    return graph(
        title, description, query, alias + "$col", unit(fields[0]), y_max=100 if fields[0].unit == "%" else None
    ), 12


def own_panel() -> tuple[dict, int]:
    """Each job's own GPU use on a shared GPU: the device's readings x its worker's share of the kernel time,
    at the points that carry the share (once per gpu.process-interval, on shared GPUs only)."""
    share = field(schema.GPU, "worker_gpu_share").name
    names = [field(schema.GPU, n).name for n in ("utilization_gpu", "sm_active", "pipe_tensor_active")]
    inner = ", ".join(f'"{n}" * "{share}" / 100 AS "own_{n}"' for n in names)
    outer = ", ".join(f'mean("own_{n}") AS "own_{n}"' for n in names)
    query = nested(outer, inner, f"{SAMPLES} AND {BUSY}", 'time($__interval), "worker", "index", "job" fill(none)')
    description = (
        "On a GPU several workers (or other processes) share: each job's own utilization, SM active and tensor "
        "activity, the device's readings scaled by its worker's worker_gpu_share (a process that only holds "
        "memory reads ~0; the jobs of one GPU add up to at most the device's). The device-wide figures: the "
        "'Was the GPU busy?' panel above; query.gpu_during_tasks(db) and query.gpu_per_prefix(db) give both per job, DAG "
        "and task prefix."
    )
    alias = "$tag_worker GPU $tag_index job $tag_job $col"
    return graph(
        "Each job's own GPU use on a shared GPU (device x its worker's share)",
        description,
        query,
        alias,
        "percent",
        y_max=100,
    ), 24


def depth_panels() -> list[list[tuple[dict, int]]]:
    """Why the GPU was slow and whose work it was: GPM (Hopper+), per-worker shares, the Telegraf extras."""
    return [
        [
            several(
                "Was the GPU busy? utilization vs SM active vs occupancy vs tensor vs DRAM (GPM)",
                ("utilization_gpu", "sm_active", "sm_occupancy", "pipe_tensor_active", "dram_active"),
            ),
            several(
                "Each worker's share of a shared GPU (of its kernel time; its SM and memory-controller time)",
                ("worker_gpu_share", "worker_utilization_gpu", "worker_utilization_memory"),
                group=("worker", "index", "job"),
            ),
        ],
        [own_panel()],
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
        f"FROM \"{schema.DAG}\" WHERE {SESSION} AND \"job\" =~ /^$job$/ AND \"dag\" =~ /^$dag$/ "
        f"AND \"event\" = 'end' AND $timeFilter GROUP BY \"job\""
    )
    rows = [
        [
            (timeseries("GPU utilization per GPU", gpu_util, "mean", SAMPLES, PER_DEVICE, DEVICE_ALIAS), 12),
            (timeseries("GPU memory used per GPU", gpu_mem, "max", SAMPLES, PER_DEVICE, DEVICE_ALIAS), 12),
        ],
        [
            (timeseries("GPU memory used (% of capacity)", gpu_mem_pct, "max", SAMPLES, PER_DEVICE, DEVICE_ALIAS), 12),
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
        [accounting_panel()],
        *depth_panels(),
        [
            (timeseries("Running tasks per worker", tasks, "max", SAMPLES, ["worker"], "$tag_worker", stack=True), 12),
            (timeseries("Worker memory (RSS)", rss, "max", SAMPLES, ["worker"], "$tag_worker"), 12),
        ],
        [
            (timeseries("Host CPU", host_cpu, "mean", f'{SESSION} AND "host" =~ /^$host$/', ["host"], "$tag_host"), 12),
            (
                timeseries(
                    "Host memory used", host_mem, "mean", f'{SESSION} AND "host" =~ /^$host$/', ["host"], "$tag_host"
                ),
                12,
            ),
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
