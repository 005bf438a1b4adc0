"""A session's per-node summary into MLflow, under the metric names ML pipelines already log.

The reference is the ``perf.py`` helper of Azure ML's pipeline components
(``PerformanceMetricsCollector`` samples psutil every second, ``PerfReportPlotter``
logs one value per node with ``step=node``). :data:`REFERENCE` maps each of its metric
names to a figure of :func:`~dask_influx_metrics.client.summary.summary`; :data:`GPU` adds
ours beside them. Names are logged as MLflow stores the reference's (its logger drops the
characters MLflow refuses: ``max_t_(mem_percent)`` becomes ``max_t_mem_percent``).

Each node (host, in natural order) is one ``step``; the run's tags ``node.<step>`` name
them. ``job=N``: that job's figures go into the run. ``job=None``: the whole session's
go into the run, and each job's into a child run of it (``mlflow.parentRunId``, named
``job N``, tag ``dask_influx_metrics.job``). A figure the data cannot give (a resource not
recorded, no cores recorded for CPU hours) is left out, never logged as 0 or NaN.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import pandas as pd

from . import summary as _summary
from .query.metricnames import natural_key

EXTRA = "pip install dask-influx-metrics[mlflow]"
MIB = float(2**20)  # the reference's "mb": bytes / (1024 * 1024)
TAG = "dask_influx_metrics"
BATCH = 1000  # MLflow takes at most 1000 metrics per log_batch


class Name(NamedTuple):
    reference: str  # the name perf.py passes to log_metric
    logged: str  # the name MLflow stores (perf.py's logger drops what MLflow refuses)
    resource: str  # the summary row
    column: str  # the summary column
    scale: float = 1.0  # logged value = summary value x scale


def _name(reference: str, resource: str, column: str, scale: float = 1.0) -> Name:
    return Name(reference, reference.replace("(", "").replace(")", ""), resource, column, scale)


REFERENCE = (
    _name("max_t_(cpu_pct_per_cpu_avg)", "cpu", "max"),
    _name("cpu_avg_utilization_pct", "cpu", "mean"),
    _name("cpu_avg_utilization_at100_pct", "cpu", "at_100", 100.0),
    _name("cpu_avg_utilization_over80_pct", "cpu", "above_80", 100.0),
    _name("cpu_avg_utilization_over40_pct", "cpu", "above_40", 100.0),
    _name("cpu_avg_utilization_over20_pct", "cpu", "above_20", 100.0),
    _name("max_t_(cpu_pct_per_cpu_min)", "cpu", "core_min"),
    _name("max_t_(cpu_pct_per_cpu_max)", "cpu", "core_max"),
    _name("node_cpu_hours", "cpu", "device_hours"),
    _name("node_unused_cpu_hours", "cpu", "unused_device_hours"),
    _name("max_t_(mem_percent)", "memory", "max"),
    _name("max_t_disk_usage_percent", "disk", "max"),
    _name("total_disk_io_read_mb", "disk", "read_bytes", 1 / MIB),
    _name("total_disk_io_write_mb", "disk", "write_bytes", 1 / MIB),
    _name("total_net_io_lo_sent_mb", "network", "lo_sent_bytes", 1 / MIB),
    _name("total_net_io_ext_sent_mb", "network", "ext_sent_bytes", 1 / MIB),
    _name("total_net_io_lo_recv_mb", "network", "lo_recv_bytes", 1 / MIB),
    _name("total_net_io_ext_recv_mb", "network", "ext_recv_bytes", 1 / MIB),
)
# Ours beside them: the node's GPUs, each physical GPU once (its "all workers" gpu row), and its memory mean.
GPU = (
    _name("gpu_avg_utilization_pct", "gpu", "mean"),
    _name("max_t_gpu_pct", "gpu", "max"),
    _name("gpu_avg_utilization_at100_pct", "gpu", "at_100", 100.0),
    _name("gpu_avg_utilization_over80_pct", "gpu", "above_80", 100.0),
    _name("gpu_avg_utilization_over40_pct", "gpu", "above_40", 100.0),
    _name("gpu_avg_utilization_over20_pct", "gpu", "above_20", 100.0),
    _name("node_gpu_count", "gpu", "devices"),
    _name("node_gpu_hours", "gpu", "device_hours"),
    _name("node_unused_gpu_hours", "gpu", "unused_device_hours"),
    _name("node_held_idle_gpu_hours", "gpu", "held_idle_device_hours"),
    _name("mem_avg_percent", "memory", "mean"),
)
NAMES = REFERENCE + GPU


def require_mlflow():
    """``mlflow``, or an ImportError naming the extra that installs it."""
    try:
        import mlflow
    except ImportError:
        raise ImportError(f"logging to MLflow needs mlflow (or mlflow-skinny): {EXTRA}") from None
    return mlflow


def node_metrics(frame: pd.DataFrame, job=None) -> dict[str, float]:
    """``{logged name: value}`` of one node's summary ``frame`` (:func:`.summary.summary` of the node's workers) for
    ``job`` (None: the whole session); figures that are NaN or missing are left out."""
    rows = frame[frame["job"].isna() if job is None else frame["job"] == job]
    out = {}
    for n in NAMES:
        if n.resource == "gpu":  # the node's GPUs counted once over its workers
            mine = rows[(rows["resource"] == "gpu") & (rows["worker"] == _summary.ALL)]
        else:  # every worker of the node holds its node's rows
            mine = rows[(rows["resource"] == n.resource) & rows["worker_index"].notna()]
        if mine.empty or n.column not in mine or pd.isna(mine[n.column].iloc[0]):
            continue
        out[n.logged] = float(mine[n.column].iloc[0]) * n.scale
    return out


def summaries(db, job=None) -> dict[str, pd.DataFrame]:
    """``{node: summary of its workers}`` in natural order (each node's GPUs then count once over its workers)."""
    where = db.hosts()
    nodes = sorted({h for w, h in where.items() if w in db.workers()}, key=natural_key)
    return {
        node: _summary.summary(db, workers=[w for w in db.workers() if where.get(w) == node], job=job) for node in nodes
    }


def log_summary(
    db,
    run_id: str | None = None,
    job: int | None = None,
    tracking_uri: str | None = None,
    experiment: str | None = None,
) -> dict:
    """Log the per-node summary of ``db`` (a :class:`~dask_influx_metrics.query.Store`, e.g. ``monitor.query()``)
    into MLflow run ``run_id`` (default: the active run, else a new run in ``experiment``, by name, created if
    missing; default MLflow's default experiment); see the module docstring. ``tracking_uri``: default MLflow's
    (``MLFLOW_TRACKING_URI``). Returns ``{"run_id": ..., "jobs": {job: child run id}, "nodes": [host, ...]}``."""
    mlflow = require_mlflow()
    from mlflow.entities import Metric, RunTag

    client = mlflow.MlflowClient(tracking_uri)
    job = db.check_job(job)
    by_node = summaries(db, job)
    nodes = list(by_node)
    created = False
    if run_id is None:
        active = mlflow.active_run()
        if active is not None:
            run_id = active.info.run_id
        else:
            run_id, created = client.create_run(_experiment_id(client, experiment)).info.run_id, True
    now = int(time.time() * 1000)

    def write(into: str, scope) -> None:
        metrics = [
            Metric(key, value, now, step)
            for step, node in enumerate(nodes)
            for key, value in node_metrics(by_node[node], scope).items()
        ]
        tags = {f"{TAG}.job": "all" if scope is None else scope, f"{TAG}.source": db.scope()}
        tags.update({f"node.{step}": node for step, node in enumerate(nodes)})
        client.log_batch(into, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        for i in range(0, len(metrics), BATCH):
            client.log_batch(into, metrics=metrics[i : i + BATCH])

    children = {}
    write(run_id, job)
    if job is None:
        parent = client.get_run(run_id).info.experiment_id
        for j in db.jobs():
            tags = {"mlflow.parentRunId": run_id, "mlflow.runName": f"job {j}"}
            children[j] = client.create_run(parent, tags=tags).info.run_id
            write(children[j], j)
            client.set_terminated(children[j])
    if created:
        client.set_terminated(run_id)
    return {"run_id": run_id, "jobs": children, "nodes": nodes}


def _experiment_id(client, name: str | None) -> str:
    if name is None:
        return "0"  # MLflow's default experiment
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)
