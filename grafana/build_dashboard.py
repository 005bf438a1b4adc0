"""Build ``grafana/dashboards/dask-influx-metrics.json`` from the data contract.

Every measurement, field and unit comes from :mod:`dask_influx_metrics.schema`,
so a renamed field breaks this script (and its test), not a dashboard in
production. Run it after changing the schema and commit the output::

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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dask_influx_metrics import jobtags, schema  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboards", "dask-influx-metrics.json")
INFLUXQL = {"type": "influxdb", "uid": "dask-influxql"}
UNITS = {"%": "percent", "MiB": "decmbytes", "bytes": "bytes", "W": "watt", "C": "celsius",
         "MHz": "rothz", "count": "short", "s": "s"}

HOST_WORKER = '"host" =~ /^$host$/ AND "worker" =~ /^$worker$/'
JOB = f'"job" =~ {jobtags.influxql_regex("$job")}'  # activity points have no dag
JOB_DAG = f'{JOB} AND "dag" =~ {jobtags.influxql_regex("$dag")}'
SAMPLES = f"{HOST_WORKER} AND {JOB_DAG}"


def field(measurement: str, name: str) -> schema.Field:
    """The schema entry (raises ``KeyError`` for a name the contract lacks)."""
    return schema.FIELDS[measurement, name]


def unit(f: schema.Field) -> str:
    return UNITS.get(f.unit, "short")


def variable(name: str, query: str, regex_all: bool = False) -> dict:
    """A multi-value query variable on the InfluxQL datasource."""
    var = {"name": name, "label": name, "type": "query", "datasource": INFLUXQL,
           "query": query, "refresh": 2, "multi": True, "includeAll": True,
           "sort": 3 if regex_all else 1, "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}
    if regex_all:  # job/dag: match any element of a comma-joined list
        var["allValue"] = ".*"
    return var


def timeseries(title: str, f: schema.Field, agg: str, where: str, group: list[str], alias: str,
               stack: bool = False, panel_unit: str | None = None) -> dict:
    """A time series of ``agg(field)`` per ``group`` tags (in the field's unit, or Grafana's ``panel_unit``)."""
    tags = "".join(f', "{t}"' for t in group)
    query = (f'SELECT {agg}("{f.name}") FROM "{f.measurement}" WHERE {where} AND $timeFilter '
             f"GROUP BY time($__interval){tags} fill(none)")
    custom = {"stacking": {"mode": "normal" if stack else "none"}, "fillOpacity": 20 if stack else 0}
    return {"type": "timeseries", "title": title, "description": f.description, "datasource": INFLUXQL,
            "fieldConfig": {"defaults": {"unit": panel_unit or unit(f), "custom": custom}, "overrides": []},
            "targets": [{"refId": "A", "datasource": INFLUXQL, "rawQuery": True, "resultFormat": "time_series",
                         "query": query, "alias": alias}]}


def table(title: str, description: str, query: str) -> dict:
    return {"type": "table", "title": title, "description": description, "datasource": INFLUXQL,
            "fieldConfig": {"defaults": {}, "overrides": []},
            "targets": [{"refId": "A", "datasource": INFLUXQL, "rawQuery": True, "resultFormat": "table",
                         "query": query}]}


def panels() -> list[dict]:
    gpu_util = field(schema.GPU, "utilization_gpu")
    gpu_mem = field(schema.GPU, "memory_used")
    gpu_mem_pct = field(schema.GPU, "memory_used_percent")
    host_cpu = field(schema.HOST, "cpu_percent")
    host_mem = field(schema.HOST, "memory_used_percent")
    tasks = field(schema.WORKER, "tasks")
    rss = field(schema.WORKER, "rss")
    duration = field(schema.DAG, "duration")
    per_gpu = ["worker", "index"]
    peak = (f'SELECT max("{gpu_mem.name}") AS "peak_{gpu_mem.name}_mib", '
            f'max("{gpu_mem_pct.name}") AS "peak_{gpu_mem_pct.name}", '
            f'mean("{gpu_util.name}") AS "mean_{gpu_util.name}" '
            f"FROM \"{schema.GPU}\" WHERE {SAMPLES} AND \"dag\" != '0' AND $timeFilter GROUP BY \"job\"")
    dags = (f'SELECT "{field(schema.DAG, "dag").name}", "{field(schema.DAG, "status").name}", "{duration.name}", '
            f'"{field(schema.DAG, "tasks").name}", "{field(schema.DAG, "label").name}" '
            f"FROM \"{schema.DAG}\" WHERE \"job\" =~ /^$job$/ AND \"dag\" =~ /^$dag$/ "
            f"AND \"event\" = 'end' AND $timeFilter GROUP BY \"job\"")
    rows = [
        [(timeseries("GPU utilization per worker/GPU", gpu_util, "mean", SAMPLES, per_gpu,
                     "$tag_worker GPU $tag_index"), 12),
         (timeseries("GPU memory used per worker/GPU", gpu_mem, "max", SAMPLES, per_gpu,
                     "$tag_worker GPU $tag_index"), 12)],
        [(timeseries("GPU memory used (% of capacity)", gpu_mem_pct, "max", SAMPLES, per_gpu,
                     "$tag_worker GPU $tag_index"), 12),
         (table("Peak GPU memory per job", "Busy samples only (dag != '0'); a job tag such as '1,2' "
                "means the jobs shared the worker at that time.", peak), 12)],
        [(timeseries("Running tasks per worker", tasks, "max", SAMPLES, ["worker"], "$tag_worker",
                     stack=True), 12),
         (timeseries("Worker memory (RSS)", rss, "max", SAMPLES, ["worker"], "$tag_worker"), 12)],
        [(timeseries("Host CPU", host_cpu, "mean", '"host" =~ /^$host$/', ["host"], "$tag_host"), 12),
         (timeseries("Host memory used", host_mem, "mean", '"host" =~ /^$host$/', ["host"], "$tag_host"), 12)],
        [(table("DAGs (ended)", "One row per DAG that ended in the time range.", dags), 24)],
        [(timeseries("Task throughput per job (tasks finished per interval)", field(schema.TASK, "duration"),
                     "count", SAMPLES, ["job"], "job $tag_job", stack=True, panel_unit="short"), 12),
         (timeseries("Worker time per job and activity (s, Dask fine performance metrics)",
                     field(schema.ACTIVITY, "value"), "sum", f"{HOST_WORKER} AND {JOB} AND \"unit\" = 'seconds'",
                     ["job", "activity"], "job $tag_job $tag_activity", stack=True, panel_unit="s"), 12)],
    ]
    out, panel_id = [], 1
    for y, row in enumerate(rows):
        x = 0
        for panel, width in row:
            out.append({"id": panel_id, "gridPos": {"x": x, "y": y * 8, "w": width, "h": 8}, **panel})
            panel_id, x = panel_id + 1, x + width
    return out


def dashboard() -> dict:
    tag_values = 'SHOW TAG VALUES FROM "{m}" WITH KEY = "{k}"'
    annotation = (f'SELECT "{field(schema.DAG, "event").name}", "{field(schema.DAG, "tasks").name}", '
                  f'"job", "dag" FROM "{schema.DAG}" WHERE "job" =~ /^$job$/ AND "dag" =~ /^$dag$/ AND $timeFilter')
    return {
        "uid": "dask-influx-metrics", "title": "Dask: GPUs per job and DAG", "tags": ["dask", "gpu"],
        "schemaVersion": 39, "version": 1, "editable": True, "timezone": "browser", "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"}, "graphTooltip": 1,
        "templating": {"list": [
            variable("host", tag_values.format(m=schema.WORKER, k="host")),
            variable("worker", tag_values.format(m=schema.WORKER, k="worker") + ' WHERE "host" =~ /^$host$/'),
            variable("job", tag_values.format(m=schema.DAG, k="job"), regex_all=True),
            variable("dag", f'SELECT DISTINCT("{field(schema.DAG, "dag").name}") FROM "{schema.DAG}" '
                     'WHERE "job" =~ /^$job$/ AND $timeFilter', regex_all=True),
        ]},
        "annotations": {"list": [
            {"name": "DAG boundaries", "datasource": INFLUXQL, "enable": True, "iconColor": "rgba(255, 96, 96, 1)",
             "target": {"refId": "Anno", "query": annotation, "rawQuery": True, "fromAnnotations": True,
                        "textColumn": "event", "tagsColumn": "job,dag"}},
        ]},
        "panels": panels(),
    }


def main() -> None:
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(dashboard(), f, indent=2)
        f.write("\n")
    print(OUT)


if __name__ == "__main__":
    main()
