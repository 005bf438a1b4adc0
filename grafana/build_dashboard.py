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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from panelkit import (  # noqa: E402
    BUSY,
    HELD_IDLE_MINUTES,
    INFLUXQL,
    LOSS_MINUTES,
    SESSION,
    field,
    session_variable,
    variable,
)
from panels import panels  # noqa: E402

from dask_influx_metrics import schema  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "dashboards", "dask-influx-metrics.json")
ALERTS_OUT = os.path.join(HERE, "provisioning", "alerting", "dask-alerts.yaml")
UID = "dask-influx-metrics"


def sample_ms() -> dict:
    """The sampling interval (ms) for GPU-hours: the median step between a GPU's samples in the range
    (as ``query.summary(db)`` takes it); a single value, so Grafana inserts it as a plain number."""
    util = field(schema.GPU, "utilization_gpu").name
    query = (
        f'SELECT round(median("step")) FROM (SELECT elapsed("{util}", 1ms) AS "step" FROM "{schema.GPU}" '
        f'WHERE {SESSION} AND "host" =~ /^$host$/ AND $timeFilter GROUP BY "host", "worker", "index") '
        "WHERE $timeFilter"
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
        f'"job", "dag" FROM "{schema.DAG}" WHERE {SESSION} AND "job" =~ /^$job$/ AND "dag" =~ /^$dag$/ '
        "AND $timeFilter"
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
                session_variable(),
                variable("host", tag_values.format(m=schema.WORKER, k="host") + f" WHERE {SESSION}"),
                variable(
                    "worker",
                    tag_values.format(m=schema.WORKER, k="worker") + f' WHERE {SESSION} AND "host" =~ /^$host$/',
                ),
                variable("job", tag_values.format(m=schema.DAG, k="job") + f" WHERE {SESSION}", regex_all=True),
                variable(
                    "dag",
                    f'SELECT DISTINCT("{field(schema.DAG, "dag").name}") FROM "{schema.DAG}" '
                    f'WHERE {SESSION} AND "job" =~ /^$job$/ AND $timeFilter',
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
    """A GPU on which a worker's every sample in the window is busy (a job's task running on it) with memory
    in use, and no kernel ran: one alert per GPU (host, uuid) and worker (each worker writes its own points
    of the GPUs it uses, tagged with its own jobs)."""
    util, mem = field(schema.GPU, "utilization_gpu").name, field(schema.GPU, "memory_used").name
    seconds = HELD_IDLE_MINUTES * 60
    every = f'FROM "{schema.GPU}" WHERE $timeFilter GROUP BY "host", "uuid", "worker"'
    held = f'FROM "{schema.GPU}" WHERE {BUSY} AND "{mem}" > 0 AND $timeFilter GROUP BY "host", "uuid", "worker"'
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
        f"{HELD_IDLE_MINUTES} minutes while a job on worker {{{{ $labels.worker }}}} held it",
        f"In each of the last {HELD_IDLE_MINUTES} minutes' samples a job's task ran on this worker, which "
        "uses this GPU, with memory in use on it, and utilization_gpu was 0. The dashboard's job "
        "variable and GPU-hours table show which job.",
    )


def dropped_rule() -> dict:
    """Points dropped or refused by any sender's sink within the window: one alert per sender and sink."""
    dropped, refused = schema.DELIVERY_FIELDS[1:3]
    senders = '"host", "worker", "sink", "session"'  # counters restart with each session's senders
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
