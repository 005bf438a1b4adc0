"""``/metrics`` for Prometheus, served by the host's sampling agent (setting ``prometheus.port``).

One process serves (the agent): a custom ``prometheus_client`` collector (:class:`AccountingCollector`)
reads the agent's :class:`~..sampling.accounting.Accounting` at each scrape, so there is no multiprocess
mode, no per-sample work for the endpoint and nothing in the workers. Names follow Prometheus' naming
practices: base units (seconds, bytes, joules, watts), ``_total`` counters, ratios 0-1. Labels are bounded:
``host`` on every series, ``uuid`` of a GPU (``dask_gpu_info`` and the per-GPU gauges add ``gpu``, NVML's
index), ``worker`` (address), and on the per-job series ``session`` (the monitoring session: job numbers
start from 1 in each) and ``dask_job`` (the Dask job: Prometheus gives every target a ``job`` label of its
own, and would rename ours ``exported_job``); never a DAG, task or key. A job's series leave ``accounting.retention`` (300 s) after it last ran on the host. A
counter's new series is exposed at 0 at its first scrape, its total from the next one on: ``increase()``
then counts the job's first increment too (Prometheus cannot see what a series held before its first
scrape). The table of metrics and the series count are in docs/attribution.md ("Prometheus").

``prometheus_client`` is imported only when the port is set (extra ``prometheus``); a missing package or
a port in use is said once, by name, and sampling goes on without the endpoint.
"""

from __future__ import annotations

import logging
import threading
from typing import NamedTuple

from ..schema import ACCOUNTING_FIELDS

logger = logging.getLogger(__name__)
MIB = 2.0**20
JOB = "dask_job"  # the Dask job's label: Prometheus' own "job" names the scrape job


class Family(NamedTuple):
    """One metric family: its name, type, help, and where its value comes from."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    source: str  # an accounting field, a gpu field, or a per-worker gpu field
    scale: float = 1.0


# Per job and GPU (labels host, uuid, dask_job; "idle": no job's): the accounting rows
JOB_GPU = (
    Family(
        "dask_job_gpu_seconds", "counter", "Time the job had tasks executing on a worker using the GPU", "gpu_seconds"
    ),
    Family(
        "dask_job_gpu_busy_seconds",
        "counter",
        "The job's own kernel time: utilization x time, on a shared GPU x the job's share",
        "busy_seconds",
    ),
    Family("dask_job_gpu_sm_active_seconds", "counter", "The job's own SM-active time (GPM)", "sm_active_seconds"),
    Family(
        "dask_job_gpu_tensor_active_seconds", "counter", "The job's own tensor-pipe time (GPM)", "tensor_active_seconds"
    ),
    Family(
        "dask_job_gpu_energy_joules",
        "counter",
        "The job's part of the GPU's energy counter (jobs and idle add up to the device's)",
        "energy_joules",
    ),
    Family(
        "dask_job_gpu_memory_peak_bytes",
        "gauge",
        "Most GPU memory the job's workers' process trees held on the GPU while it ran",
        "memory_peak_bytes",
    ),
)
MEAN_MEMORY = Family(
    "dask_job_gpu_memory_mean_bytes",
    "gauge",
    "Time-averaged GPU memory the job's workers' process trees held on the GPU while it ran",
    "memory_byte_seconds",
)
JOB_CPU = Family(
    "dask_job_cpu_seconds",
    "counter",
    "CPU time of the host's worker processes while they ran the job's tasks",
    "cpu_seconds",
)
# Per GPU (labels host, uuid, gpu): the latest reading, and the device's totals
GPU = (
    Family(
        "dask_gpu_utilization_ratio",
        "gauge",
        "Time a kernel ran over NVML's last period (0-1)",
        "utilization_gpu",
        0.01,
    ),
    Family("dask_gpu_sm_active_ratio", "gauge", "GPM: SM-active share of the last window (0-1)", "sm_active", 0.01),
    Family(
        "dask_gpu_tensor_active_ratio",
        "gauge",
        "GPM: tensor-pipe share of the last window (0-1)",
        "pipe_tensor_active",
        0.01,
    ),
    Family("dask_gpu_memory_used_bytes", "gauge", "Device memory in use", "memory_used", MIB),
    Family("dask_gpu_memory_total_bytes", "gauge", "Device memory capacity", "memory_total", MIB),
    Family("dask_gpu_power_watts", "gauge", "Board power draw", "power_draw"),
    Family("dask_gpu_temperature_celsius", "gauge", "GPU core temperature", "temperature_gpu"),
)
GPU_TOTALS = (
    Family(
        "dask_gpu_busy_seconds", "counter", "Kernel time since the agent started (every job and idle)", "busy_seconds"
    ),
    Family(
        "dask_gpu_energy_joules",
        "counter",
        "Energy since the agent started, from the device's counter (every job and idle)",
        "energy_joules",
    ),
)
INFO = Family("dask_gpu_info", "gauge", "A GPU's NVML index (gpu) and product name; always 1", "")
# Per worker and GPU (labels host, worker, uuid): the worker's own latest figures
WORKER_GPU = (
    Family(
        "dask_gpu_worker_memory_used_bytes",
        "gauge",
        "GPU memory the worker's process tree holds",
        "worker_memory_used",
        MIB,
    ),
    Family(
        "dask_gpu_worker_share_ratio",
        "gauge",
        "The worker's share of the GPU's kernel time over the last per-process window (shared GPUs only; 0-1)",
        "worker_gpu_share",
        0.01,
    ),
)
FAMILIES = (*JOB_GPU, MEAN_MEMORY, JOB_CPU, *GPU, *GPU_TOTALS, INFO, *WORKER_GPU)
_INDEX = {name: i for i, name in enumerate(ACCOUNTING_FIELDS)}


def series_count(gpus: int, jobs: int, workers_x_gpus: int) -> int:
    """The most series one agent serves: ``gpus`` GPUs, ``jobs`` jobs that ran within ``accounting.retention``,
    ``workers_x_gpus`` (worker, GPU) pairs. Each job's rows only on the GPUs it ran on: at most this.

    >>> series_count(gpus=8, jobs=16, workers_x_gpus=8)
    1065
    """
    per_job_gpu = len(JOB_GPU) + 1  # + mean memory
    per_gpu = len(GPU) + len(GPU_TOTALS) + 1  # + info
    return per_job_gpu * gpus * (jobs + 1) + (jobs + 1) + per_gpu * gpus + len(WORKER_GPU) * workers_x_gpus


class AccountingCollector:
    """A ``prometheus_client`` collector over an :class:`~..sampling.accounting.Accounting`: ``collect()``
    builds every family from its state at the scrape. ``labels``: ``host`` (every series) and ``session``
    (the per-job ones)."""

    def __init__(self, accounting, labels: dict):
        self.accounting, self.labels = accounting, dict(labels)
        self.host = {"host": self.labels["host"]}
        self._seen: set = set()  # (job, uuid) of the rows exposed so far: a new one shows 0 at its first scrape
        self._lock = threading.Lock()

    def describe(self):
        return []  # no collect() at registration: the families depend on the data

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from prometheus_client.samples import Sample

        of_job, host = list(self.labels.values()), self.host["host"]

        def family(f: Family, labels):
            kind = CounterMetricFamily if f.kind == "counter" else GaugeMetricFamily
            return kind(f.name, f.help, labels=labels)

        def name(f: Family) -> str:
            return f.name + "_total" if f.kind == "counter" else f.name

        rows, gauges = self.accounting.rows(), self.accounting.gauges()
        keys = {(job, uuid) for job, uuid, _ in rows}
        with self._lock:
            new, self._seen = keys - self._seen, keys
        job_labels = [*self.labels, "uuid", JOB]
        per_job = [(family(f, job_labels), name(f), _INDEX[f.source], f.kind == "counter") for f in JOB_GPU]
        mean, cpu = family(MEAN_MEMORY, job_labels), family(JOB_CPU, [*self.labels, JOB])
        gpu_seconds, byte_seconds, cpu_seconds = (
            _INDEX[n] for n in ("gpu_seconds", "memory_byte_seconds", "cpu_seconds")
        )
        for job, uuid, values in rows:  # Samples made here: one labels dict per row, shared by its families
            first = (job, uuid) in new  # counters at 0 for one scrape: increase() sees the series start
            if uuid is None:
                if values[cpu_seconds] is not None:
                    cpu.add_metric([*of_job, job], 0.0 if first else values[cpu_seconds])
                continue
            labels = {**self.labels, "uuid": uuid, JOB: job}
            for fam, sample, i, counter in per_job:
                if values[i] is not None:
                    fam.samples.append(Sample(sample, labels, 0.0 if first and counter else values[i]))
            if values[byte_seconds] is not None and values[gpu_seconds]:
                mean.samples.append(Sample(mean.name, labels, values[byte_seconds] / values[gpu_seconds]))
        per_gpu = [(family(f, ["host", "uuid", "gpu"]), f) for f in (*GPU, *GPU_TOTALS)]
        info = family(INFO, ["host", "uuid", "gpu", "name"])
        per_worker = [(family(f, ["host", "worker", "uuid"]), f) for f in WORKER_GPU]
        for uuid, (tags, device, workers, totals) in gauges.items():
            gpu = str(tags.get("nvml_index", tags.get("index", "")))
            info.add_metric([host, uuid, gpu, str(tags.get("name", ""))], 1.0)
            for fam, f in per_gpu:
                value = (totals if f in GPU_TOTALS else device).get(f.source)
                if value is not None:
                    fam.add_metric([host, uuid, gpu], value * f.scale)
            for worker, own in workers.items():
                for fam, f in per_worker:
                    if own.get(f.source) is not None:
                        fam.add_metric([host, worker, uuid], own[f.source] * f.scale)
        made = [fam for fam, *_ in per_job] + [mean, cpu] + [fam for fam, _ in per_gpu] + [info]
        return [fam for fam in made + [fam for fam, _ in per_worker] if fam.samples]


class Endpoint:
    """The running ``/metrics`` server; :meth:`close` stops it."""

    def __init__(self, server, thread, port: int):
        self.server, self.thread, self.port = server, thread, port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve(settings, accounting, labels: dict, report) -> Endpoint | None:
    """Serve ``/metrics`` on ``prometheus.address:prometheus.port`` when the port is set (``labels``: ``host``
    and ``session``, see :class:`AccountingCollector`); None when it is not, or when it cannot be served
    (``report(what, message, key=...)`` hears why, once)."""
    port = settings.prometheus_port
    if port is None or accounting is None:
        return None
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as e:
        report(
            "prometheus",
            f"prometheus.port is {port}, but prometheus_client is not installed ({e}): "
            "pip install 'dask-influx-metrics[prometheus]'; /metrics not served, sampling goes on",
            key=("prometheus", "import"),
        )
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AccountingCollector(accounting, labels))
    try:
        server, thread = start_http_server(port, addr=settings.prometheus_address, registry=registry)
    except OSError as e:
        report(
            "prometheus",
            f"prometheus.port {port} on {settings.prometheus_address} cannot be served ({e.strerror or e}: another "
            "process, or another session's agent on this host, holds it?); /metrics not served, sampling goes on",
            key=("prometheus", "bind"),
        )
        return None
    logger.info("serving /metrics for Prometheus on %s:%d", settings.prometheus_address, port)
    return Endpoint(server, thread, port)
