"""Grafana provisioning and the generated dashboard.

Structure (ids, grid, datasources, variables), then every InfluxQL query of
the dashboard (panels, variables, annotations) run against the real influxd on
data a real monitored LocalCluster wrote, with Grafana's substitutions done
the way Grafana does them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from dask_influx_metrics import schema

ROOT = os.path.join(os.path.dirname(__file__), "..")
GRAFANA = os.path.join(ROOT, "grafana")
DASHBOARDS = os.path.join(GRAFANA, "dashboards")
DATASOURCES = os.path.join(GRAFANA, "provisioning", "datasources", "influxdb.yaml")
PROVIDER = os.path.join(GRAFANA, "provisioning", "dashboards", "dask.yaml")
ALERTS = os.path.join(GRAFANA, "provisioning", "alerting", "dask-alerts.yaml")
BUILTIN_VARS = {
    "timeFilter",
    "__interval",
    "__interval_ms",
    "__timeFilter",
    "__from",
    "__to",
    "tag_worker",
    "tag_index",
    "tag_uuid",
    "tag_host",
    "tag_job",
    "tag_activity",
    "tag_sink",
    "col",
}
# Names a query may use besides the schema's FIELDS and TAGS (see schema.DELIVERY).
DELIVERY_FIELDS = {(schema.DELIVERY, n) for n in schema.DELIVERY_FIELDS}


def _dashboards() -> dict[str, dict]:
    out = {}
    for name in sorted(os.listdir(DASHBOARDS)):
        if name.endswith(".json"):
            with open(os.path.join(DASHBOARDS, name)) as f:
                out[name] = json.load(f)
    assert out, "no dashboards"
    return out


def _queries(dash: dict) -> list[tuple[str, str]]:
    """(where, InfluxQL) for every panel target, variable and annotation."""
    found = [(f"variable {v['name']}", v["query"]) for v in dash["templating"]["list"]]
    found += [(f"annotation {a['name']}", a["target"]["query"]) for a in dash["annotations"]["list"]]
    for p in dash["panels"]:
        found += [(f"panel {p['id']} {p['title']}/{t['refId']}", t["query"]) for t in p.get("targets", [])]
    return found


def _build():
    sys.path.insert(0, GRAFANA)
    try:
        import build_dashboard
    finally:
        sys.path.remove(GRAFANA)
    return build_dashboard


def test_generated_dashboard_is_committed():
    """The committed JSON and alert rules are what build_dashboard.py writes from the schema."""
    build = _build()
    with open(build.OUT) as f:
        assert json.load(f) == json.loads(json.dumps(build.dashboard())), (
            "run grafana/build_dashboard.py and commit its output"
        )
    with open(build.ALERTS_OUT) as f:
        assert yaml.safe_load(f) == build.alerts(), "run grafana/build_dashboard.py and commit its output"


@pytest.mark.parametrize("name", list(_dashboards()))
def test_dashboard_structure(name):
    dash = _dashboards()[name]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[x, y] = p["title"]
    with open(DATASOURCES) as f:
        uids = {d["uid"] for d in yaml.safe_load(f)["datasources"]}
    refs = [p["datasource"] for p in dash["panels"]]
    refs += [t["datasource"] for p in dash["panels"] for t in p.get("targets", [])]
    refs += [v["datasource"] for v in dash["templating"]["list"]]
    refs += [a["datasource"] for a in dash["annotations"]["list"]]
    assert {r["uid"] for r in refs} <= uids
    defined = {v["name"] for v in dash["templating"]["list"]} | BUILTIN_VARS
    for where, q in _queries(dash) + [
        (p["title"], t.get("alias", "")) for p in dash["panels"] for t in p.get("targets", [])
    ]:
        used = set(re.findall(r"\$\{?(\w+)", q))
        assert used <= defined, f"{where}: undefined {used - defined}"


def _check_names(where: str, q: str) -> None:
    """Every quoted name of an InfluxQL query is the schema's (its measurement's field, a tag) or an alias
    the query itself defines (``AS "x"``)."""
    fields = set(schema.FIELDS) | DELIVERY_FIELDS
    measurements = {m for m, _ in fields}
    used = re.findall(r'FROM "(\w+)"', q)
    assert all(m in measurements for m in used), f"{where}: unknown measurement in {used}"
    if q.startswith("SELECT"):
        (m,) = used
        tags = schema.MEASUREMENT_TAGS[schema.DELIVERY] if m == schema.DELIVERY else schema.TAGS
        known = {f for mm, f in fields if mm == m} | set(tags) | set(re.findall(r'AS "([^"]+)"', q))
        for name in re.findall(r'"(\w+)"', re.sub(r'FROM "\w+"', "", q)):
            assert name in known, f"{where}: {m} has no field or tag {name}"


def test_dashboard_uses_only_schema_names():
    for dash in _dashboards().values():
        for where, q in _queries(dash):
            _check_names(where, q)


def test_name_check_catches_a_misspelt_field():
    with pytest.raises(AssertionError, match="gpu has no field or tag power_drew"):
        _check_names("panel", 'SELECT mean("power_drew") FROM "gpu" WHERE $timeFilter')
    with pytest.raises(AssertionError, match="delivery has no field or tag index"):
        _check_names("panel", 'SELECT last("errors") FROM "delivery" WHERE $timeFilter GROUP BY "index"')


def test_a_panel_for_every_gpu_field():
    """Every collected gpu field (memory_total only as the denominator of memory_used_percent) is drawn."""
    queries = " ".join(q for _, q in _queries(_dashboards()["dask-influx-metrics.json"]))
    drawn = {name for m, name in schema.FIELDS if m == schema.GPU and f'"{name}"' in queries}
    assert drawn == {name for m, name in schema.FIELDS if m == schema.GPU} - {"memory_total"}


def test_provider_path_is_where_dashboards_are_mounted():
    with open(PROVIDER) as f:
        (provider,) = yaml.safe_load(f)["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


# --- every query against the real influxd ------------------------------------------------


def _regex_escape(value: str) -> str:
    """Grafana's regex escaping of variable values for InfluxQL (kbn.regexEscape)."""
    return re.sub(r"([\\^$*+?.()|{}\[\]/])", r"\\\1", value)


def substitute(query: str, values: dict[str, list[str] | str], since: str = "now() - 1h") -> str:
    """What Grafana sends: multi-value variables (lists) as ``(a|b)``, a single-value one (a string) as
    it is (also as ``${name:raw}``), time macros filled in."""
    query = query.replace("$timeFilter", f"time > {since}").replace("$__interval", "10s")
    for name, vals in sorted(values.items(), key=lambda kv: -len(kv[0])):
        text = vals if isinstance(vals, str) else "(" + "|".join(_regex_escape(v) for v in vals) + ")"
        query = query.replace(f"${{{name}:raw}}", text).replace(f"${name}", text)
    return query


def variable_values(influxd, dash: dict, database: str, since: str = "now() - 1h", chosen=None) -> dict:
    """Each variable's values, in order (later variables use earlier ones), as Grafana reads them: the
    first column of each row (SHOW TAG VALUES: ``value``); ``chosen``: a single-value variable's choice
    among its values (Grafana's default: the first in its sort order)."""
    values: dict[str, list[str] | str] = {}
    for var in dash["templating"]["list"]:
        rows = influxd.query(substitute(var["query"], values, since), db=database)
        assert rows, f"variable {var['name']}: no values"
        found = sorted({str(r["value"] if "value" in r else [v for k, v in r.items() if k != "time"][0]) for r in rows})
        if var["name"] in (chosen or {}):
            assert chosen[var["name"]] in found, (var["name"], found)
            values[var["name"]] = chosen[var["name"]]
        elif var["multi"]:
            values[var["name"]] = found
        else:
            (values[var["name"]],) = found
    return values


def _is_delivery(query: str) -> bool:
    return f'FROM "{schema.DELIVERY}"' in query


# Written by NVML only, not by the simulated GPU of the monitored run: test_gpu_panels_on_written_points.
SIMULATED = (
    "utilization_gpu",
    "utilization_memory",
    "memory_used",
    "memory_total",
    "memory_used_percent",
    "power_draw",
    "temperature_gpu",
    "clocks_current_sm",
)
NOT_SIMULATED = tuple(n for m, n in schema.FIELDS if m == schema.GPU and n not in SIMULATED)


@pytest.fixture(scope="module")
def monitored(monitored_both):
    """Every test here runs on both runs: ``dag-tag`` true and false (conftest.py)."""
    return monitored_both


@pytest.mark.parametrize("name", list(_dashboards()))
def test_every_query_returns_rows(monitored, name):
    """Every query but sampling health's (the sinks' counters; test_delivery_panels) on a real run."""
    influxd = monitored.influxd
    dash = _dashboards()[name]
    values = variable_values(influxd, dash, monitored.database, chosen={"session": monitored.session["id"]})
    failures = []
    for where, q in _queries(dash):
        if _is_delivery(q) or any(f'"{name}"' in q for name in NOT_SIMULATED):
            continue
        sent = substitute(q, values)
        assert "$" not in sent.replace("$/", "").replace("(,|$)", ""), sent
        if not influxd.query(sent, db=monitored.database):
            failures.append(f"{where}: {sent}")
    assert not failures, "queries without rows:\n" + "\n".join(failures)


def test_task_panels_return_rows(influxd):
    import task_points

    database = influxd.create_database("grafana_tasks")
    task_points.write_influxd(influxd, database)
    values = {
        "session": "",
        "host": ["node1"],
        "worker": task_points.WORKERS,
        "job": ["1", "2"],
        "dag": ["1", "2", "3"],
    }
    panels = [
        p
        for p in _dashboards()["dask-influx-metrics.json"]["panels"]
        if re.search(r'FROM "(task|activity)"', p["targets"][0]["query"])
    ]
    assert len(panels) == 2
    for panel in panels:
        sent = substitute(panel["targets"][0]["query"], values).replace("now() - 1h", str(task_points.T0))
        rows = influxd.query(sent, db=database)
        assert {r["job"] for r in rows} == {"1", "2"}, sent


def test_build_script_runs(tmp_path):
    """The generator is a plain script (python grafana/build_dashboard.py)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", "import build_dashboard as b; print(len(b.panels()))"],
        cwd=GRAFANA,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and int(out.stdout) >= 8, out.stderr


# -- Grafana's own schema: @grafana/schema types, checked by tsc (scripts/setup.sh installs both) ---
GRAFANA_TOOLS = os.path.join(ROOT, ".tools", "grafana", "node_modules")


def _schema_check(dashboard: dict, tmp_path) -> subprocess.CompletedProcess:
    """``tsc`` on grafana/schema_check.ts.in with ``dashboard`` pasted in."""
    tsc = os.path.join(GRAFANA_TOOLS, "typescript", "bin", "tsc")
    if not (os.path.exists(tsc) and os.path.isdir(os.path.join(GRAFANA_TOOLS, "@grafana", "schema"))):
        message = "@grafana/schema + typescript not installed in .tools/grafana (run scripts/setup.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    with open(os.path.join(GRAFANA, "schema_check.ts.in")) as f:
        source = f.read().replace("DASHBOARD_JSON", json.dumps(dashboard, indent=1))
    (tmp_path / "dashboard.ts").write_text(source)
    options = {
        "strict": True,
        "noEmit": True,
        "module": "esnext",
        "moduleResolution": "bundler",
        "target": "es2022",
        "skipLibCheck": True,
        "types": [],
        "paths": {"@grafana/schema": [os.path.join(GRAFANA_TOOLS, "@grafana", "schema")]},
    }
    (tmp_path / "tsconfig.json").write_text(json.dumps({"compilerOptions": options, "files": ["dashboard.ts"]}))
    return subprocess.run(["node", tsc, "-p", str(tmp_path)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", list(_dashboards()))
def test_dashboard_passes_grafanas_own_schema(name, tmp_path):
    out = _schema_check(_dashboards()[name], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_grafana_schema_check_catches_wrong_types_and_unknown_fields(tmp_path):
    dash = json.loads(json.dumps(_dashboards()["dask-influx-metrics.json"]))
    dash["panels"][0]["gridPos"]["h"] = "8"
    dash["panels"][0]["targets"][0]["rawquery"] = True
    dash["templating"]["list"][0]["definition"] = "SHOW TAG VALUES"
    out = _schema_check(dash, tmp_path)
    assert out.returncode != 0
    assert "'string' is not assignable to type 'number'" in out.stdout
    assert "'\"rawquery\"' does not exist in type 'InfluxQLQuery'" in out.stdout
    assert "'\"definition\"' does not exist in type 'VariableModel'" in out.stdout


# --- panels on hand-written points: exact figures -----------------------------------------
T0 = 1_763_900_000_000_000_000
SINCE = str(T0 - 1)
WORKER = "tcp://127.0.0.1:1001"


OTHER = "tcp://127.0.0.1:1002"


def _gpu_lines() -> list[str]:
    """One worker, 2 GPUs, a sample every 200 ms: job 1 busy for samples 0-29 (GPU 0 at 50 %, software
    power cap in every other sample; GPU 1 at 0 % with 1000 MiB in use: held idle), idle 30-39, job 2
    busy 40-59 (both GPUs at 80 %, GPU 1 hardware slowdown). A second worker shares GPU 1 (its index 0)
    and runs job 2 too in samples 40-59: it writes the same device readings, 3 ms later, its own tags."""
    lines = []
    for i in range(60):
        job, dag = ("1", "1") if i < 30 else ("1", "0") if i < 40 else ("2", "2")
        for index in (0, 1):
            util = 80.0 if job == "2" and dag != "0" else 50.0 if index == 0 and dag == "1" else 0.0
            reasons = (4 if i % 2 else 0) if index == 0 and dag == "1" else 8 if index == 1 and dag == "2" else 0
            fields = (
                f"utilization_gpu={util},utilization_memory={util / 2},memory_used=1000,memory_total=8000,"
                f"memory_used_percent=12.5,power_draw={60 + util},temperature_gpu=40,clocks_current_sm=1410,"
                f"worker_memory_used=600,clocks_event_reasons={reasons}i,"
                + ",".join(
                    f"{n}=1{'i' if schema.FIELDS[schema.GPU, n].type is int else ''}"
                    for n in NOT_SIMULATED
                    if n not in ("worker_memory_used", "clocks_event_reasons")
                )
            )
            lines.append(
                f"gpu,host=node1,worker={WORKER},job={job},dag={dag},index={index},"
                f"uuid=GPU-{index},nvml_index={index},name=Test {fields} {T0 + i * 200_000_000}"
            )
            if index == 1:
                tags = ("2", "2") if i >= 40 else ("0", "0")
                lines.append(
                    f"gpu,host=node1,worker={OTHER},job={tags[0]},dag={tags[1]},index=0,"
                    f"uuid=GPU-1,nvml_index=1,name=Test {fields} {T0 + i * 200_000_000 + 3_000_000}"
                )
    return lines


@pytest.fixture(scope="module")
def written_gpu(influxd):
    database = influxd.create_database("grafana_gpu")
    influxd.write(_gpu_lines(), db=database)
    return database


def _panel(title: str) -> dict:
    (panel,) = [p for p in _dashboards()["dask-influx-metrics.json"]["panels"] if p["title"] == title]
    return panel


def _run(influxd, database, panel_title, values, since=SINCE):
    return influxd.query(substitute(_panel(panel_title)["targets"][0]["query"], values, since), db=database)


def _gpu_values(influxd, database) -> dict:
    values = {"session": "", "host": ["node1"], "worker": [WORKER, OTHER], "job": ["1", "2"], "dag": ["1", "2"]}
    (var,) = [v for v in _dashboards()["dask-influx-metrics.json"]["templating"]["list"] if v["name"] == "sample_ms"]
    (row,) = influxd.query(substitute(var["query"], values, SINCE), db=database)
    return {**values, "sample_ms": str(row["round"])}


def test_gpu_panels_on_written_points(influxd, written_gpu):
    """Every gpu panel returns rows on points with every NVML field, the sampling interval is read from
    the data, and GPU-hours, held-idle GPU-hours and clock-event reasons are exact: each physical GPU
    counted once, one line per GPU in the device panels, though two workers write GPU 1."""
    values = _gpu_values(influxd, written_gpu)
    assert values["sample_ms"] == "200"
    for where, q in _queries(_dashboards()["dask-influx-metrics.json"]):
        if where.startswith("panel") and 'FROM "gpu"' in q:
            assert influxd.query(substitute(q, values, SINCE), db=written_gpu), where
    lines = _run(influxd, written_gpu, "GPU utilization per GPU", values)
    assert {r["uuid"] for r in lines} == {"GPU-0", "GPU-1"} and {"worker", "index"}.isdisjoint(lines[0])
    hours = {r["job"]: r for r in _run(influxd, written_gpu, "GPU-hours and held-idle GPU-hours per job", values)}
    assert set(hours) == {"1", "2"}  # the idle samples (dag 0, job 1) count for no job
    assert hours["1"]["gpu_hours"] == pytest.approx(30 * 2 * 0.2 / 3600)
    assert hours["1"]["held_idle_gpu_hours"] == pytest.approx(30 * 0.2 / 3600)  # GPU 1 only
    assert hours["2"]["gpu_hours"] == pytest.approx(20 * 2 * 0.2 / 3600)
    assert hours["2"]["held_idle_gpu_hours"] == 0
    slowed = _run(
        influxd,
        written_gpu,
        "Clock-event reasons: % of samples slowed down, per reason",
        values,
        since=str(T0 + 40 * 200_000_000 - 1),
    )  # job 2 only: GPU 1 in hardware slowdown throughout
    assert {(r["uuid"], r["hardware slowdown"], r["software power cap"]) for r in slowed} == {
        ("GPU-0", 0, 0),
        ("GPU-1", 100, 0),
    }
    slowed = _run(
        influxd,
        written_gpu,
        "Clock-event reasons: % of samples slowed down, per reason",
        {**values, "job": ["1"], "dag": ["1"]},
    )
    assert sum(r["software power cap"] for r in slowed if r["uuid"] == "GPU-0") / len(
        [r for r in slowed if r["uuid"] == "GPU-0"]
    ) == pytest.approx(50)
    held = _run(
        influxd,
        written_gpu,
        "GPU held idle while a job runs (% of busy samples)",
        {**values, "job": ["1"], "dag": ["1"]},
    )
    assert {(r["uuid"], r["mean"]) for r in held} == {("GPU-0", 0), ("GPU-1", 100)}


def _delivery_lines() -> list[str]:
    """Two senders' counters every 10 s for 2 minutes: a worker's UDP sink that drops 5 points per
    step after 1 minute, and the scheduler's HTTP sink that restarts (counters back to 0) at 1 minute."""
    lines = []
    for i in range(13):
        t = T0 + i * 10_000_000_000
        dropped = 5 * max(0, i - 6)
        lines.append(
            f"delivery,host=node1,worker={WORKER},sink=udp points_sent={100 * i}i,"
            f"points_dropped={dropped}i,points_refused=0i,points_spooled=0i,errors=0i {t}"
        )
        sent = 50 * (i if i < 6 else i - 6)
        lines.append(
            f"delivery,host=node0,worker=scheduler,sink=http points_sent={sent}i,points_dropped=0i,"
            f"points_refused={2 if i == 3 else 0}i,points_spooled=0i,errors=0i {t}"
        )
    return lines


def test_delivery_panels(influxd):
    """Sampling health: rates per sender and sink, totals over the range across a sender restart."""
    database = influxd.create_database("grafana_delivery")
    influxd.write(_delivery_lines(), db=database)
    values = {"session": "", "host": ["node1"], "worker": ["x"], "job": ["1"], "dag": ["1"]}  # every sender counts
    sent = _run(influxd, database, "Points sent per second, per sender and sink", values)
    assert {(r["worker"], r["sink"]) for r in sent} == {("tcp://127.0.0.1:1001", "udp"), ("scheduler", "http")}
    assert {r["points_sent"] for r in sent if r["sink"] == "udp"} == {10}  # 100 points per 10 s
    lost = _run(influxd, database, "Points dropped, refused, spooled and sink errors per second", values)
    assert max(r["points_dropped"] for r in lost if r["sink"] == "udp") == 0.5
    totals = {
        r["sink"]: r
        for r in _run(influxd, database, "Sampling health: points per sender and sink in the time range", values)
    }
    assert (totals["udp"]["points_sent"], totals["udp"]["points_dropped"]) == (1200, 30)
    # http: 0..250 before the restart, 50..300 after it (the step across the reset is left out)
    assert (totals["http"]["points_sent"], totals["http"]["points_refused"]) == (250 + 300, 2)


def test_the_session_variable_keeps_sessions_apart(influxd):
    """Two sessions' senders in one database: the session variable lists them newest first (Grafana's
    default: the latest), and the panels count one session's points only."""
    database = influxd.create_database("grafana_sessions")
    first, second = "20240501T120000-000001-aaaaaa", "20240501T130000-000001-bbbbbb"
    lines = [line.replace(",sink=", f",session={s},sink=", 1) for s in (first, second) for line in _delivery_lines()]
    influxd.write(lines, db=database)
    (var,) = [v for v in _dashboards()["dask-influx-metrics.json"]["templating"]["list"] if v["name"] == "session"]
    assert var["sort"] == 2 and not var["multi"] and not var["includeAll"]  # alphabetical, descending: newest first
    assert sorted((r["value"] for r in influxd.query(var["query"], db=database)), reverse=True) == [second, first]
    totals = "Sampling health: points per sender and sink in the time range"
    for session in (first, second):
        values = {"session": session, "host": ["node1"], "worker": ["x"], "job": ["1"], "dag": ["1"]}
        rows = {r["sink"]: r for r in _run(influxd, database, totals, values)}
        assert (rows["udp"]["points_sent"], rows["http"]["points_refused"]) == (1200, 2)  # not 2400 and 4
