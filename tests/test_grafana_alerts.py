"""The example alert rules (grafana/provisioning/alerting/dask-alerts.yaml), checked offline.

No Grafana runs here, so the file is checked twice: against the shape Grafana's file provisioning
reads (``AlertRuleGroupV1``/``AlertRuleV1``/``QueryV1`` of grafana/pkg/services/provisioning/alerting,
the states and reducers of ngalert and its server-side expressions), and by evaluating each rule the
way Grafana does (its InfluxQL queries on the real influxd, then reduce, math and threshold) on
points written so that each rule must fire for some series and not for the others.
"""

from __future__ import annotations

import copy
import os
import re

import pytest
import yaml
from test_grafana import ALERTS, DATASOURCES, _check_names, _dashboards

# Keys Grafana's file provisioning reads (yaml tags of its V1 structs); anything else is ignored
# silently by Grafana, so a misspelt key would drop a setting without a word.
TOP_KEYS = {
    "apiVersion",
    "groups",
    "deleteRules",
    "contactPoints",
    "deleteContactPoints",
    "policies",
    "resetPolicies",
    "templates",
    "deleteTemplates",
    "muteTimes",
    "deleteMuteTimes",
}
GROUP_KEYS = {"orgId", "name", "folder", "interval", "rules"}
RULE_KEYS = {
    "uid",
    "title",
    "condition",
    "data",
    "dasboardUid",
    "dashboardUid",
    "panelId",
    "noDataState",
    "execErrState",
    "for",
    "keepFiringFor",
    "missing_series_evals_to_resolve",
    "annotations",
    "labels",
    "isPaused",
    "notification_settings",
    "record",
}
QUERY_KEYS = {"refId", "queryType", "relativeTimeRange", "datasourceUid", "model"}
NO_DATA_STATES = {"Alerting", "NoData", "OK", "KeepLast"}
EXEC_ERR_STATES = {"Alerting", "Error", "OK", "KeepLast"}
REDUCERS = {"sum", "mean", "min", "max", "count", "last", "median"}
REDUCE_MODES = {"", "dropNN", "replaceNN"}
EVALUATORS = {"gt", "lt", "within_range", "outside_range", "within_range_included", "outside_range_included"}
EXPRESSION_TYPES = {"math", "reduce", "resample", "classic_conditions", "threshold", "sql"}
DURATION = re.compile(r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$")  # Prometheus'
REF = re.compile(r"\$\{?(\w+)\}?")


def seconds(duration: str) -> float:
    match = DURATION.match(duration)
    assert duration and match, f"not a duration: {duration!r}"
    units = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
    return sum(int(match.group(2 * k + 2) or 0) * u for k, u in enumerate(units))


def _keys(where: str, found: dict, allowed: set) -> list[str]:
    return [f"{where}: unknown key {k!r}" for k in sorted(set(found) - allowed)]


def problems(doc: dict) -> list[str]:
    """What Grafana's provisioning would refuse or silently drop in an alerting file (empty: none)."""
    with open(DATASOURCES) as f:
        datasources = {d["uid"] for d in yaml.safe_load(f)["datasources"]}
    panels = {d["uid"]: {p["id"] for p in d["panels"]} for d in _dashboards().values()}
    out = _keys("file", doc, TOP_KEYS)
    if doc.get("apiVersion") != 1:
        out.append("file: apiVersion must be 1")
    uids = []
    for g in doc.get("groups", []):
        out += _keys(f"group {g.get('name')}", g, GROUP_KEYS)
        if not str(g.get("name", "")).strip() or not str(g.get("folder", "")).strip():
            out.append(f"group {g.get('name')}: name and folder must be set")
        if seconds(g.get("interval", "")) % 10:
            out.append(f"group {g.get('name')}: interval must be a multiple of 10s (Grafana's base interval)")
        for r in g.get("rules", []):
            out += rule_problems(r, datasources, panels)
            uids.append(r.get("uid"))
    if len(uids) != len(set(uids)):
        out.append("rule uids repeat")
    return out


def rule_problems(r: dict, datasources: set, panels: dict) -> list[str]:
    where = f"rule {r.get('title')!r}"
    out = _keys(where, r, RULE_KEYS)
    if not r.get("title") or len(r["title"]) > 190 or "$" in r["title"]:
        out.append(f"{where}: title must be 1-190 characters without $ (Grafana expands $VAR in it)")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", str(r.get("uid", ""))):
        out.append(f"{where}: uid must be 1-40 letters, digits, - or _")
    if r.get("noDataState") not in NO_DATA_STATES or r.get("execErrState") not in EXEC_ERR_STATES:
        out.append(f"{where}: noDataState/execErrState not one of {sorted(NO_DATA_STATES)}/{sorted(EXEC_ERR_STATES)}")
    for key in ("for", "keepFiringFor"):
        if key in r:
            seconds(r[key])
    for key in ("annotations", "labels"):
        values = r.get(key, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
            out.append(f"{where}: {key} must map strings to strings")
        if any("${" in v for v in values.values()):
            out.append(f"{where}: {key} use ${{...}}, which provisioning expands from the environment")
    if not all(re.fullmatch(r"[A-Za-z_]\w*", k) for k in r.get("labels", {})):
        out.append(f"{where}: label names must be [A-Za-z_][A-Za-z0-9_]*")
    if panels.get(r.get("dashboardUid")) is None or r.get("panelId") not in panels[r["dashboardUid"]]:
        out.append(f"{where}: dashboardUid/panelId name no provisioned panel")
    refs = [q.get("refId") for q in r.get("data", [])]
    if not refs or len(refs) != len(set(refs)):
        out.append(f"{where}: data must be set, refIds unique")
    if r.get("condition") not in refs:
        out.append(f"{where}: condition {r.get('condition')!r} is not a refId of its data")
    for q in r.get("data", []):
        out += query_problems(f"{where} {q.get('refId')}", q, set(refs) - {q.get("refId")}, datasources)
    return out


def query_problems(where: str, q: dict, others: set, datasources: set) -> list[str]:
    out = _keys(where, q, QUERY_KEYS)
    model = q.get("model", {})
    if model.get("refId") != q.get("refId"):
        out.append(f"{where}: model.refId differs")
    if q.get("datasourceUid") == "__expr__":
        kind = model.get("type")
        used = set(REF.findall(model.get("expression", ""))) if kind == "math" else {model.get("expression")}
        if kind not in EXPRESSION_TYPES or not used or not used <= others:
            out.append(f"{where}: expression {kind} {model.get('expression')!r} must use other refIds")
        if kind == "reduce" and (
            model.get("reducer") not in REDUCERS or model.get("settings", {}).get("mode", "") not in REDUCE_MODES
        ):
            out.append(f"{where}: reducer/mode not one of {sorted(REDUCERS)}/{sorted(REDUCE_MODES)}")
        if kind == "threshold":
            evaluators = [c.get("evaluator", {}) for c in model.get("conditions", [])]
            if (
                len(evaluators) != 1
                or evaluators[0].get("type") not in EVALUATORS
                or not all(isinstance(p, (int, float)) for p in evaluators[0].get("params", [None]))
            ):
                out.append(f"{where}: threshold needs one evaluator of {sorted(EVALUATORS)} with numbers")
        return out
    if q.get("datasourceUid") not in datasources:
        out.append(f"{where}: datasourceUid {q.get('datasourceUid')!r} is not provisioned")
    span = q.get("relativeTimeRange", {})
    if not (isinstance(span.get("from"), int) and isinstance(span.get("to"), int) and span["from"] > span["to"] >= 0):
        out.append(f"{where}: relativeTimeRange needs from > to >= 0 (seconds)")
    query = model.get("query", "")
    if not model.get("rawQuery") or "$timeFilter" not in query:
        out.append(f"{where}: a raw InfluxQL query with $timeFilter")
    extra = set(REF.findall(query.replace("$timeFilter", "")))
    if extra:
        out.append(f"{where}: alert queries have no dashboard variables: {sorted(extra)}")
    try:
        _check_names(where, query)
    except AssertionError as e:
        out.append(str(e))
    return out


def _alerts() -> dict:
    with open(ALERTS) as f:
        return yaml.safe_load(f)


def _rules() -> dict:
    return {r["uid"]: r for g in _alerts()["groups"] for r in g["rules"]}


def test_alert_file_is_what_grafana_provisioning_reads():
    assert problems(_alerts()) == []
    assert set(_rules()) == {"dask-gpu-held-idle", "dask-samples-dropped"}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.update(noDataState="Ok"), "noDataState/execErrState not one of"),
        (lambda r: r.update(fro="5m"), "unknown key 'fro'"),
        (lambda r: r.update(condition="Z"), "condition 'Z' is not a refId"),
        (lambda r: r["data"][-1]["model"].update(expression="$D == 0 && $Z == $F"), "must use other refIds"),
        (lambda r: r["data"][3]["model"].update(reducer="avg"), "reducer/mode not one of"),
        (
            lambda r: r["data"][0]["model"].update(
                query=r["data"][0]["model"]["query"].replace("WHERE", 'WHERE "host" =~ /^$host$/ AND')
            ),
            "have no dashboard variables: ['host']",
        ),
        (
            lambda r: r["data"][0]["model"].update(
                query=r["data"][0]["model"]["query"].replace("utilization_gpu", "utilisation_gpu")
            ),
            "gpu has no field or tag utilisation_gpu",
        ),
        (lambda r: r["data"][0].update(datasourceUid="influx"), "'influx' is not provisioned"),
        (lambda r: r["data"][0].update(relativeTimeRange={"from": 0, "to": 600}), "from > to"),
        (lambda r: r.update(panelId=999), "name no provisioned panel"),
        (lambda r: r["annotations"].update(summary="${HOSTNAME}"), "expands from the environment"),
        (lambda r: r.update(uid="a" * 41), "uid must be 1-40"),
    ],
)
def test_alert_check_catches(change, message):
    doc = copy.deepcopy(_alerts())
    change(doc["groups"][0]["rules"][0])
    assert any(message in p for p in problems(doc)), problems(doc)


# --- evaluating the rules as Grafana does, on the real influxd ----------------------------------
T0 = 1_763_900_000_000_000_000
S = 1_000_000_000
END = T0 + 20 * 60 * S  # the evaluation instant


def _group_tags(query: str) -> list[str]:
    return re.findall(r'"(\w+)"', query.rsplit("GROUP BY", 1)[1])


def evaluate(rule: dict, influxd, database: str) -> set[frozenset]:
    """The label sets for which ``rule`` fires at END: its InfluxQL queries over their relative time range
    (``$timeFilter`` as Grafana writes it), then its reduce, math and threshold expressions, series joined
    by their labels."""
    results: dict[str, dict[frozenset, float]] = {}
    for q in rule["data"]:
        model = q["model"]
        if q["datasourceUid"] != "__expr__":
            start = END - q["relativeTimeRange"]["from"] * S
            sent = model["query"].replace("$timeFilter", f"time >= {start // 10**6}ms and time <= {END // 10**6}ms")
            tags = _group_tags(sent)
            series: dict[frozenset, list[float]] = {}
            for row in influxd.query(sent, db=database):
                (value,) = [v for k, v in row.items() if k != "time" and k not in tags]
                series.setdefault(frozenset((t, row[t]) for t in tags), []).append(value)
            results[q["refId"]] = series
        elif model["type"] == "reduce":
            assert model["reducer"] == "last"
            results[q["refId"]] = {k: v[-1] for k, v in results[model["expression"]].items() if v}
        elif model["type"] == "math":
            used = REF.findall(model["expression"])
            python = REF.sub(r"v['\1']", model["expression"]).replace("&&", " and ").replace("||", " or ")
            common = set.intersection(*(set(results[u]) for u in used))
            results[q["refId"]] = {k: float(eval(python, {}, {"v": {u: results[u][k] for u in used}})) for k in common}
        elif model["type"] == "threshold":
            (condition,) = model["conditions"]
            assert condition["evaluator"]["type"] == "gt"
            limit = condition["evaluator"]["params"][0]
            results[q["refId"]] = {k: float(v > limit) for k, v in results[model["expression"]].items()}
    return {labels for labels, value in results[rule["condition"]].items() if value}


def _gpu_lines(dag_tag: bool) -> list[str]:
    """20 minutes of one sample per 10 s for 5 GPUs of host n1 (uuid: what each shows)."""

    def util(uuid: str, i: int) -> float:
        if uuid == "U-busy-once" and i == 110:
            return 30.0
        if uuid == "U-used-earlier":
            return 0.0 if i < 50 else 40.0
        return 0.0

    lines = []
    for i in range(121):
        t = T0 + i * 10 * S
        for uuid in ("U-held", "U-busy-once", "U-idle-once", "U-no-memory", "U-used-earlier"):
            dag = "0" if uuid == "U-idle-once" and i == 100 else "1"
            memory = 0.0 if uuid == "U-no-memory" else 2048.0
            tags = f"host=n1,worker=w1,job=1,index=0,uuid={uuid}" + (f",dag={dag}" if dag_tag else "")
            fields = f"utilization_gpu={util(uuid, i)},memory_used={memory}" + ("" if dag_tag else f',dag="{dag}"')
            lines.append(f"gpu,{tags} {fields} {t}")
    return lines


@pytest.mark.parametrize("dag_tag", [True, False], ids=["dag-tag", "dag-field"])
def test_held_idle_rule_fires_only_for_a_gpu_held_idle_all_window(influxd, dag_tag):
    database = influxd.create_database(f"alerts_gpu_{int(dag_tag)}")
    influxd.write(_gpu_lines(dag_tag), db=database)
    assert evaluate(_rules()["dask-gpu-held-idle"], influxd, database) == {
        frozenset({("host", "n1"), ("uuid", "U-held"), ("worker", "w1")})
    }


SESSION = "20240501T120000-000001-abcdef"


def _delivery_lines() -> list[str]:
    """20 minutes of sink counters every 10 s: one sender drops points in the last 5 minutes, one
    dropped long before, one restarts in the window (counters back to 0), one is refused by the server."""
    lines = []
    for i in range(121):
        t, recent = T0 + i * 10 * S, max(0, i - 100)
        counters = {
            ("n1", "w1", "udp"): (100 * i, 3 * recent, 0),
            ("n1", "scheduler", "http"): (50 * i, 7, 0),
            ("n2", "w2", "spool"): (1000 + 10 * i if i < 105 else 10 * (i - 105), 0, 0),
            ("n2", "w3", "http"): (20 * i, 0, recent // 4),
        }
        for (host, worker, sink), (sent, dropped, refused) in counters.items():
            lines.append(
                f"delivery,host={host},worker={worker},session={SESSION},sink={sink} points_sent={sent}i,"
                f"points_dropped={dropped}i,points_refused={refused}i,points_spooled=0i,errors=0i {t}"
            )
    return lines


def test_dropped_rule_fires_only_for_senders_that_lost_points_in_the_window(influxd):
    database = influxd.create_database("alerts_delivery")
    influxd.write(_delivery_lines(), db=database)
    assert evaluate(_rules()["dask-samples-dropped"], influxd, database) == {  # per session: counters restart
        frozenset({("host", "n1"), ("worker", "w1"), ("sink", "udp"), ("session", SESSION)}),
        frozenset({("host", "n2"), ("worker", "w3"), ("sink", "http"), ("session", SESSION)}),
    }


def test_alert_rules_are_mounted_where_grafana_reads_them():
    """deploy/compose mounts grafana/provisioning/ whole; the alerting folder sits beside datasources/."""
    assert os.path.dirname(os.path.dirname(ALERTS)) == os.path.dirname(os.path.dirname(DATASOURCES))
    with open(ALERTS) as f:
        assert not re.search(r"[&*]id\d", f.read()), "YAML anchors: edit one rule, change another"
