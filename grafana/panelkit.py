"""The dashboard's building blocks: the filters every query shares (one session, host/worker, job/DAG), Grafana's
units for the contract's, the variables, and the panel and target makers (panels.py puts the panels together)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dask_influx_metrics import jobtags, schema  # noqa: E402

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

# One session (the variable: the latest by default; job and DAG numbers restart in each). A prefix match:
# ids have one length, and an empty value (points without a session tag) matches every point.
SESSION = '"session" =~ /^$session/'
HOST_WORKER = f'{SESSION} AND "host" =~ /^$host$/ AND "worker" =~ /^$worker$/'
JOB = f'"job" =~ {jobtags.influxql_regex("$job")}'  # activity points have no dag
JOB_DAG = f'{JOB} AND "dag" =~ {jobtags.influxql_regex("$dag")}'
SAMPLES = f"{HOST_WORKER} AND {JOB_DAG}"
BUSY = "\"dag\" != '0'"
# A GPU's device-wide fields are written on each worker using it (its own job tags): device panels draw
# one line per physical GPU (host, uuid), per-worker fields one per worker and GPU.
PER_DEVICE, DEVICE_ALIAS = ["host", "uuid"], "$tag_host $tag_uuid"
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


def session_variable() -> dict:
    """The session: one at a time, newest first (ids sort by start), so the latest is chosen."""
    return {
        "name": "session",
        "label": "session",
        "type": "query",
        "datasource": INFLUXQL,
        "query": f'SHOW TAG VALUES FROM "{schema.DELIVERY}" WITH KEY = "{schema.SESSION}"',
        "refresh": 2,
        "multi": False,
        "includeAll": False,
        "sort": 2,
        "description": "the monitoring session (newest first; job and DAG numbers restart at 1 in each). "
        "Empty where the points carry no session tag (written before sessions were tagged, or with "
        "session-tag: false): then every session is shown",
    }


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


def nested(outer: str, inner: str, where: str, group: str) -> str:
    """``SELECT outer`` over the gpu points' ``SELECT inner`` (``where`` and the time filter), ``GROUP BY group``."""
    return (
        f'SELECT {outer} FROM (SELECT {inner} FROM "{schema.GPU}" WHERE {where} AND $timeFilter) '
        f"WHERE $timeFilter GROUP BY {group}"
    )


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
