"""The data contract: every measurement, tag and field this package writes.

Everything else (sources, the line-protocol encoder, sinks, queries, CSV,
dashboards) takes its names from here. The "Data contract" table of docs/data-contract.md is
this module, rendered.

Points are written with nanosecond timestamps (InfluxDB's default precision),
on the scheduler's clock: each worker adds ``worker.scheduler_delay``.

Example
-------
>>> FIELDS["gpu", "memory_used"].unit
'MiB'
>>> TRACKING["compute-util"]
(('gpu', 'utilization_gpu'),)
"""

from __future__ import annotations

from typing import NamedTuple, Union

FieldValue = Union[float, int, str]


class Point(NamedTuple):
    """One line of line protocol: ``measurement,tags fields time``.

    >>> Point("gpu", {"index": "0"}, {"utilization_gpu": 12.0}, 1_700_000_000_000_000_000)
    Point(measurement='gpu', tags={'index': '0'}, fields={'utilization_gpu': 12.0}, time_ns=1700000000000000000)
    """

    measurement: str
    tags: dict[str, str]
    fields: dict[str, FieldValue]
    time_ns: int


class Reading(NamedTuple):
    """What a source returns: a point without the common tags and time."""

    measurement: str
    tags: dict[str, str]
    fields: dict[str, FieldValue]


class Field(NamedTuple):
    measurement: str
    name: str
    type: type  # float, int or str: the encoder writes exactly this type
    unit: str
    description: str


# Measurements
GPU = "gpu"
HOST = "host"
DISK = "disk"
WORKER = "worker"
CUSTOM = "custom"
DAG = "dag"
TASK = "task"
ACTIVITY = "activity"
DELIVERY = "delivery"
ACCOUNTING = "accounting"
IDLE_JOB = "idle"  # the job tag of an accounting point's idle row: no job's

SESSION = "session"  # the tag (or, with session-tag: false, the field) naming the monitoring session
# Tags on every worker point, in this order.
COMMON_TAGS = ("host", "worker", "job", "dag", SESSION)
# Extra tags on per-device points (gpu, and per-device custom metrics).
DEVICE_TAGS = ("index", "nvml_index", "uuid", "name")

TAGS = {
    "host": "hostname of the machine the worker (or scheduler) runs on",
    "worker": "worker address, e.g. tcp://10.0.0.5:40211",
    "job": "job number(s) of the tasks executing at sample time, ascending and "
    "comma-joined ('3' or '3,4'); idle samples carry the last job this worker "
    "ran for ('0' before the first task). Host points: the jobs executing on "
    "every worker of the host (idle: the writer's last job)",
    "dag": "DAG number(s) of the tasks executing at sample time, ascending and "
    "comma-joined; '0' when the worker is idle (a string field instead with the setting dag-tag: false). "
    "Host points: as job, '0' only when no worker of the host runs a task",
    SESSION: "the monitoring session's id (made at start(): its UTC start time to the microsecond and 6 random "
    "hex digits, e.g. 20261121T100000-000001-3fa9c2), on every point of every measurement, so sessions "
    "sharing one database stay apart (a string field instead with the setting session-tag: false)",
    "index": "device index as the worker sees it (0 = first of CUDA_VISIBLE_DEVICES)",
    "nvml_index": "physical device index as NVML numbers it (the same on every worker of the host)",
    "uuid": "device UUID (GPU-..., MIG-...; SIM-... for simulated devices)",
    "name": "device product name",
    "prefix": "task and activity points: the task's prefix (Dask's key_split of its key, e.g. 'sum-aggregate')",
    "state": "task points: the state the task's execution ended in ('memory', 'error', or 'cancelled' "
    "when it was released while running)",
    "activity": "activity points: the activity as Dask's fine performance metrics name it "
    "('thread-cpu', 'thread-noncpu', 'disk-read', custom context_meter labels, ...; never fixed here)",
    "unit": "activity points: the activity's unit as Dask names it ('seconds', 'bytes', 'count')",
    "sink": "delivery points: the sink the counters are of ('udp', 'http' or 'spool')",
    "since": "accounting points: when the row began counting (Unix ns); a restarted one begins again from 0",
    "path": "disk points: the mount point of a filesystem the host's workers write to (as Telegraf's disk input)",
}

# The tags each measurement carries, besides the extra ``influx-metrics.tags``.
MEASUREMENT_TAGS = {
    GPU: COMMON_TAGS + DEVICE_TAGS,
    HOST: COMMON_TAGS,
    DISK: COMMON_TAGS + ("path",),  # a measurement of its own: readers rely on one host series per host
    WORKER: COMMON_TAGS,
    CUSTOM: COMMON_TAGS + DEVICE_TAGS,  # device tags on per-device custom metrics only
    DAG: ("host", "job", SESSION),  # dag and status are fields: one series per job, however many DAGs
    TASK: COMMON_TAGS + ("prefix", "state"),
    # Dask's digests are per prefix, not per task, so activity points have no dag (see docs/data-contract.md).
    ACTIVITY: ("host", "worker", "job", SESSION, "prefix", "activity", "unit"),
    # worker = the sending role: a worker address, "scheduler", or the host's sampling agent
    DELIVERY: ("host", "worker", SESSION, "sink"),
    # worker = the sender (the host's agent; a worker address in thread mode); job = a number or "idle";
    # uuid = the GPU (absent on a job's CPU row). Never dag, task or key: series = rows (docs/attribution.md).
    ACCOUNTING: ("host", "worker", "job", SESSION, "uuid", "since"),
}

# accounting: per (host, GPU, job) totals since ``since``, monotonic (docs/attribution.md); own: x the job's share
_ACCOUNTING = (
    ("gpu_seconds", "s", "time the job had tasks executing on a worker using the GPU (idle row: time no job had)"),
    ("busy_seconds", "s", "the job's own utilization_gpu / 100 x each window, summed (idle row: no job's)"),
    ("sm_active_seconds", "s", "the job's own sm_active / 100 x each window, summed (GPM only)"),
    ("tensor_active_seconds", "s", "the job's own pipe_tensor_active / 100 x each window, summed (GPM only)"),
    ("energy_joules", "J", "its part of the energy counter's delta (jobs and the idle row add up to it)"),
    ("memory_peak_bytes", "bytes", "most GPU memory the process trees of the workers running the job held"),
    ("memory_byte_seconds", "bytes x s", "that memory x each window, summed (mean: over gpu_seconds)"),
    ("cpu_seconds", "s", "the CPU row (no uuid): CPU time of the host's workers while they ran its tasks"),
)

_FIELDS = (
    Field(GPU, "utilization_gpu", float, "%", "time a kernel ran over the last sample period (NVML utilization.gpu)"),
    Field(
        GPU,
        "utilization_memory",
        float,
        "%",
        "time device memory was read or written (NVML utilization.memory); busy time, not capacity",
    ),
    Field(GPU, "memory_used", float, "MiB", "device memory in use (NVML memory info v2 where available)"),
    Field(GPU, "memory_total", float, "MiB", "device memory capacity"),
    Field(GPU, "memory_used_percent", float, "%", "memory_used / memory_total * 100"),
    Field(GPU, "power_draw", float, "W", "board power draw"),
    Field(GPU, "temperature_gpu", float, "C", "GPU core temperature"),
    Field(GPU, "clocks_current_sm", float, "MHz", "current SM clock"),
    Field(
        GPU,
        "worker_memory_used",
        float,
        "MiB",
        "device memory held by the worker's own process tree (NVML "
        "compute-process list), for each device the worker uses, with that worker's tags",
    ),
    Field(GPU, "clocks_event_reasons", int, "bitmask", "NVML clock-event (throttle) reasons active at sample time"),
    Field(GPU, "clocks_current_memory", float, "MHz", "current memory clock"),
    Field(
        GPU,
        "pstate",
        int,
        "",
        "performance state: 0 (P0, maximum performance) to 15 (minimum); Telegraf writes it as a tag 'P0'",
    ),
    Field(GPU, "utilization_encoder", float, "%", "time the video encoder was busy over NVML's sample period"),
    Field(GPU, "utilization_decoder", float, "%", "time the video decoder was busy over NVML's sample period"),
    Field(GPU, "utilization_jpeg", float, "%", "time the JPEG decoder was busy over NVML's sample period"),
    Field(GPU, "utilization_ofa", float, "%", "time the optical-flow accelerator was busy over NVML's sample period"),
    Field(GPU, "fan_speed", float, "%", "fan speed, percent of maximum (read at most once a second)"),
    Field(
        GPU,
        "total_energy_consumption",
        int,
        "mJ",
        "energy used since the driver loaded (counter; read every 10 s and at a worker's last sample: "
        "3.1-3.7 ms of CPU per call on an H200)",
    ),
    *(
        Field(
            GPU,
            f"ecc_errors_{c}_{k}",
            int,
            "count",
            f"{k} ECC errors {when}, all memory locations (counter; every 10 s)",
        )
        for c, when in (("volatile", "since the driver loaded"), ("aggregate", "over the GPU's lifetime"))
        for k in ("correctable", "uncorrectable")
    ),
    Field(
        GPU,
        "gr_engine_active",
        float,
        "%",
        "GPM (Hopper+): time the graphics/compute engine was active (DCGM GR_ENGINE_ACTIVE), over 10 s windows "
        "(its metric costs ~1 ms of CPU per call on an H200, the others ~2 us)",
    ),
    Field(
        GPU,
        "sm_active",
        float,
        "%",
        "GPM: share of SM time with at least one warp resident, averaged over all SMs "
        "(DCGM SM_ACTIVE): low when kernels use few SMs, even at utilization_gpu 100",
    ),
    Field(
        GPU,
        "sm_occupancy",
        float,
        "%",
        "GPM: resident warps relative to the SMs' maximum, over the window (DCGM SM_OCCUPANCY)",
    ),
    Field(GPU, "pipe_tensor_active", float, "%", "GPM: time any tensor pipe was active (DCGM PIPE_TENSOR_ACTIVE)"),
    Field(
        GPU, "pipe_tensor_hmma_active", float, "%", "GPM: time the half-precision (FP16/BF16) tensor pipe was active"
    ),
    Field(GPU, "pipe_tensor_imma_active", float, "%", "GPM: time the integer tensor pipe was active"),
    Field(GPU, "pipe_tensor_dfma_active", float, "%", "GPM: time the FP64 DFMA tensor pipe was active"),
    Field(GPU, "pipe_tensor_dmma_active", float, "%", "GPM: time the FP64 DMMA tensor pipe was active"),
    Field(
        GPU, "dram_active", float, "%", "GPM: device-memory bandwidth used, relative to the maximum (DCGM DRAM_ACTIVE)"
    ),
    Field(GPU, "pipe_fp64_active", float, "%", "GPM: time the FP64 (non-tensor) pipe was active"),
    Field(GPU, "pipe_fp32_active", float, "%", "GPM: time the FP32 (non-tensor) pipe was active"),
    Field(GPU, "pipe_fp16_active", float, "%", "GPM: time the FP16 (non-tensor) pipe was active"),
    Field(GPU, "pipe_int_active", float, "%", "GPM: time the integer pipe was active"),
    Field(GPU, "pcie_tx_bytes", float, "bytes/s", "GPM: PCIe bytes sent by the GPU per second over the window"),
    Field(GPU, "pcie_rx_bytes", float, "bytes/s", "GPM: PCIe bytes received by the GPU per second over the window"),
    Field(GPU, "nvlink_tx_bytes", float, "bytes/s", "GPM: NVLink bytes sent per second, all links"),
    Field(GPU, "nvlink_rx_bytes", float, "bytes/s", "GPM: NVLink bytes received per second, all links"),
    Field(
        GPU,
        "worker_utilization_gpu",
        float,
        "%",
        "time kernels of the sampling worker's process tree ran, over the "
        "window since the previous such point (NVML per-process smUtil, summed; at most once a second)",
    ),
    Field(
        GPU,
        "worker_utilization_memory",
        float,
        "%",
        "memory-controller busy time caused by the worker's process "
        "tree over that window (NVML per-process memUtil, summed)",
    ),
    Field(
        GPU,
        "worker_gpu_share",
        float,
        "%",
        "the worker's share of the GPU's kernel time over that window: its processes' smUtil over every process's "
        "(0 when none ran a kernel); a job's own figures on a shared GPU are the device's scaled by it",
    ),
    Field(HOST, "cpu_percent", float, "%", "whole-host CPU use since the previous sample (all cores = 100)"),
    Field(HOST, "cpu_percent_core_max", float, "%", "the busiest core's CPU use over that window (one core = 100)"),
    Field(HOST, "cpu_percent_core_min", float, "%", "the idlest core's CPU use over that window (one core = 100)"),
    Field(HOST, "cpu_count", int, "count", "logical CPUs online: the cores the per-core figures cover"),
    Field(HOST, "memory_used", int, "bytes", "host memory in use (psutil virtual_memory.used)"),
    Field(HOST, "memory_total", int, "bytes", "host memory capacity"),
    Field(HOST, "memory_used_percent", float, "%", "host memory in use, percent"),
    Field(HOST, "disk_read_bytes", int, "bytes", "cumulative bytes read from all disks (counter)"),
    Field(HOST, "disk_write_bytes", int, "bytes", "cumulative bytes written to all disks (counter)"),
    Field(HOST, "net_recv_bytes", int, "bytes", "cumulative bytes received on all interfaces (counter)"),
    Field(HOST, "net_sent_bytes", int, "bytes", "cumulative bytes sent on all interfaces (counter)"),
    Field(HOST, "net_recv_lo_bytes", int, "bytes", "cumulative bytes received on loopback interfaces (counter)"),
    Field(HOST, "net_sent_lo_bytes", int, "bytes", "cumulative bytes sent on loopback interfaces (counter)"),
    Field(HOST, "net_recv_ext_bytes", int, "bytes", "cumulative bytes received on the other interfaces (counter)"),
    Field(HOST, "net_sent_ext_bytes", int, "bytes", "cumulative bytes sent on the other interfaces (counter)"),
    Field(
        DISK, "used_percent", float, "%", "space in use, once a second: used / (used + free to non-root) x 100 (psutil)"
    ),
    Field(DISK, "used", int, "bytes", "filesystem space in use (size - free)"),
    Field(DISK, "total", int, "bytes", "filesystem size"),
    Field(WORKER, "tasks", int, "count", "tasks executing (including seceded) at sample time"),
    Field(WORKER, "running", str, "JSON", "JSON list of the executing task keys (tuples become lists)"),
    Field(WORKER, "cpu_percent", float, "%", "worker process CPU since the previous sample (one core = 100)"),
    Field(WORKER, "rss", int, "bytes", "worker process resident memory"),
    Field(WORKER, "managed_bytes", int, "bytes", "bytes of task results the worker holds (worker.state.nbytes)"),
    Field(DAG, "dag", str, "", "the DAG's number (a field, so the series count does not grow with DAGs)"),
    Field(
        DAG,
        "status",
        str,
        "",
        "'running' on submission, then 'ok', 'erred' (a task erred) or 'cancelled' "
        "(a task was released or lost before finishing: futures cancelled, client gone, restart)",
    ),
    Field(DAG, "event", str, "", "'submit' or 'end'"),
    Field(DAG, "tasks", int, "count", "tasks in the DAG (new tasks of this submission)"),
    Field(
        DAG, "label", str, "", "readable job label: new_job(label=...) of a manual job, else the submitting client's id"
    ),
    Field(DAG, "duration", float, "s", "end points: seconds from submission to end"),
    Field(TASK, "key", str, "", "the task's key as Dask prints it (str(key)); a field, never a tag"),
    Field(
        TASK,
        "start",
        float,
        "s",
        "when the task started executing, Unix seconds on the scheduler's clock; the point's own time is when it ended",
    ),
    Field(TASK, "duration", float, "s", "seconds from start to end of execution"),
    Field(TASK, "compute", float, "s", "seconds computing (Dask startstops 'compute')"),
    Field(TASK, "transfer", float, "s", "seconds fetching inputs from other workers (startstops 'transfer')"),
    Field(TASK, "disk_read", float, "s", "seconds reading spilled inputs from disk (startstops 'disk-read')"),
    Field(TASK, "disk_write", float, "s", "seconds spilling to disk (startstops 'disk-write')"),
    Field(TASK, "nbytes", int, "bytes", "size of the result (Dask's sizeof); absent when there is none"),
    Field(
        ACTIVITY,
        "value",
        float,
        "unit tag",
        "amount of the activity since the previous activity point of "
        "this worker, job and prefix (the sum of what Dask added to the worker's 'execute' digests)",
    ),
    Field(
        ACTIVITY,
        "jobs",
        int,
        "count",
        "jobs the interval's delta was split across by their tasks' execution time (1 = exact)",
    ),
    # delivery: each sender's sink counters, cumulative since the sender started (a restart starts at 0)
    Field(
        DELIVERY,
        "points_sent",
        int,
        "count",
        "points handed over: sent in UDP datagrams (not refused), "
        "written by InfluxDB over HTTP (the accepted part of a partial write too), or written to the spool",
    ),
    Field(
        DELIVERY,
        "points_dropped",
        int,
        "count",
        "points lost for good: UDP send buffer full, too long, socket "
        "error or refused by a loopback address; HTTP not written and not spooled; spool disk errors",
    ),
    Field(
        DELIVERY,
        "points_refused",
        int,
        "count",
        "points InfluxDB refused as data (HTTP 400/413/422), kept "
        "under <spool>/<session>/<role>/refused/ with its reason",
    ),
    Field(
        DELIVERY,
        "points_spooled",
        int,
        "count",
        "points the HTTP sink could not deliver (an outage) and "
        "kept under <spool>/<session>/<role>/undelivered/ for replay",
    ),
    Field(
        DELIVERY,
        "errors",
        int,
        "count",
        "failed sends: UDP socket errors, failed HTTP requests (unreachable, 5xx, auth)",
    ),
    *(Field(ACCOUNTING, name, float, unit, meaning) for name, unit, meaning in _ACCOUNTING),
)
FIELDS: dict[tuple[str, str], Field] = {(f.measurement, f.name): f for f in _FIELDS}
DELIVERY_FIELDS = tuple(f.name for f in _FIELDS if f.measurement == DELIVERY)
ACCOUNTING_FIELDS = tuple(name for name, _, _ in _ACCOUNTING)
_ACCOUNTED = ("utilization_gpu", "power_draw", "total_energy_consumption", "worker_memory_used", "worker_gpu_share")


def tag_field_collisions(extra_tags=(), custom_fields=()) -> list[str]:
    """``"measurement.name"`` for every name that is a tag and a field of one measurement.

    InfluxDB 3 refuses such writes (a tag and a field may not share a name in a
    table), so the contract has none; ``extra_tags`` (the ``tags`` setting) and
    ``custom_fields`` (custom metric names) must not create one.

    >>> tag_field_collisions()
    []
    >>> tag_field_collisions(extra_tags=["tasks"], custom_fields=["host"])
    ['custom.host', 'dag.tasks', 'worker.tasks']
    """
    fields = {m: {n for (mm, n) in FIELDS if mm == m} for m in MEASUREMENT_TAGS}
    fields[CUSTOM] |= set(custom_fields)
    return sorted(
        f"{m}.{name}"
        for m, tags in MEASUREMENT_TAGS.items()
        for name in set(tags) | set(extra_tags)
        if name in fields[m]
    )


# Custom metrics land in the ``custom`` measurement, one float field per metric
# name; per-device metrics carry the device tags.
CUSTOM_FIELD_TYPE = float

# Tracking names users pass to ``Monitor.attach(tracking=[...])`` and the
# fields each one turns on. The first four are the old dask-metrics names.
TRACKING: dict[str, tuple[tuple[str, str], ...]] = {
    "total-mem": ((GPU, "memory_used"),),
    "mem-util": ((GPU, "memory_used_percent"),),
    "compute-util": ((GPU, "utilization_gpu"),),
    "tasks": ((WORKER, "tasks"), (WORKER, "running")),
    "mem-busy": ((GPU, "utilization_memory"),),
    "power": ((GPU, "power_draw"),),
    "temperature": ((GPU, "temperature_gpu"),),
    "sm-clock": ((GPU, "clocks_current_sm"),),
    "host-cpu": ((HOST, "cpu_percent"),),
    "host-mem": ((HOST, "memory_used"), (HOST, "memory_used_percent")),
    "disk-io": ((HOST, "disk_read_bytes"), (HOST, "disk_write_bytes")),
    "net-io": tuple((HOST, f"net_{d}{k}_bytes") for k in ("", "_lo", "_ext") for d in ("recv", "sent")),
    "cpu-cores": ((HOST, "cpu_percent_core_max"), (HOST, "cpu_percent_core_min"), (HOST, "cpu_count")),
    "disk-usage": ((DISK, "used_percent"), (DISK, "used"), (DISK, "total")),
    "worker-cpu": ((WORKER, "cpu_percent"),),
    "worker-mem": ((WORKER, "rss"), (WORKER, "managed_bytes")),
    "worker-gpu-mem": ((GPU, "worker_memory_used"),),
    "throttle": ((GPU, "clocks_event_reasons"),),
    "mem-clock": ((GPU, "clocks_current_memory"),),
    "pstate": ((GPU, "pstate"),),
    "codec-util": tuple((GPU, f"utilization_{e}") for e in ("encoder", "decoder", "jpeg", "ofa")),
    "fan": ((GPU, "fan_speed"),),
    "energy": ((GPU, "total_energy_consumption"),),
    "ecc": tuple(
        (GPU, f"ecc_errors_{c}_{k}") for c in ("volatile", "aggregate") for k in ("correctable", "uncorrectable")
    ),
    "gpm": tuple(
        (GPU, f)
        for f in (
            "gr_engine_active sm_active sm_occupancy pipe_tensor_active pipe_tensor_hmma_active pipe_tensor_imma_active "
            "pipe_tensor_dfma_active pipe_tensor_dmma_active dram_active pipe_fp64_active pipe_fp32_active "
            "pipe_fp16_active pipe_int_active pcie_tx_bytes pcie_rx_bytes nvlink_tx_bytes nvlink_rx_bytes"
        ).split()
    ),
    "worker-gpu-util": (
        (GPU, "worker_utilization_gpu"),
        (GPU, "worker_utilization_memory"),
        (GPU, "worker_gpu_share"),
    ),
    "task-stream": tuple(
        (TASK, n) for n in ("key", "start", "duration", "compute", "transfer", "disk_read", "disk_write", "nbytes")
    ),
    "fine-metrics": ((ACTIVITY, "value"), (ACTIVITY, "jobs")),
    # the agent's per-job totals (docs/attribution.md), and the readings they are made of
    "accounting": (
        *((ACCOUNTING, n) for n in ACCOUNTING_FIELDS),
        *((GPU, n) for n in _ACCOUNTED),
        (WORKER, "cpu_percent"),
    ),
}
# The gpu fields that say how busy the GPU's compute was. On a GPU several workers (or other processes)
# share, a job's own figure is the device's scaled by its worker's ``worker_gpu_share``
# (docs/attribution.md); memory is per worker already (``worker_memory_used``).
SHARE_SCALED = (
    "utilization_gpu",
    "sm_active",
    "sm_occupancy",
    "dram_active",
    *(name for m, name in TRACKING["gpm"] if name.startswith("pipe_")),
)
# Fields written whenever their measurement is written at all (static, cheap).
ALWAYS = frozenset({(GPU, "memory_total"), (HOST, "memory_total")})


def fields_for(tracking) -> frozenset[tuple[str, str]]:
    """The (measurement, field) pairs that a tracking list turns on.

    Raises ``ValueError`` naming every unknown name and listing the known ones.

    >>> sorted(fields_for(["compute-util"]))
    [('gpu', 'memory_total'), ('gpu', 'utilization_gpu')]
    """
    tracking = list(tracking)
    unknown = [t for t in tracking if t not in TRACKING]
    if unknown:
        raise ValueError(f"unknown metric name(s) {unknown}; known: {sorted(TRACKING)}")
    chosen = {pair for name in tracking for pair in TRACKING[name]}
    measurements = {m for m, _ in chosen}
    return frozenset(chosen | {p for p in ALWAYS if p[0] in measurements})


# NVML's clock-event reason bits in ``clocks_event_reasons`` (nvidia-smi's names, shortened).
CLOCK_EVENT_REASONS = {
    0x1: "idle",
    0x2: "application clocks",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal",
    0x40: "hardware thermal",
    0x80: "power brake",
    0x100: "display clocks",
}
