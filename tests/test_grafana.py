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
BUILTIN_VARS = {"timeFilter", "__interval", "__interval_ms", "__timeFilter", "__from", "__to",
                "tag_worker", "tag_index", "tag_host", "tag_job", "tag_activity", "col"}


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


def test_generated_dashboard_is_committed():
    """The committed JSON is what build_dashboard.py writes from the schema."""
    sys.path.insert(0, GRAFANA)
    try:
        import build_dashboard
    finally:
        sys.path.remove(GRAFANA)
    with open(build_dashboard.OUT) as f:
        assert json.load(f) == json.loads(json.dumps(build_dashboard.dashboard())), \
            "run grafana/build_dashboard.py and commit its output"


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
    for where, q in _queries(dash) + [(p["title"], t.get("alias", "")) for p in dash["panels"]
                                      for t in p.get("targets", [])]:
        used = set(re.findall(r"\$\{?(\w+)", q))
        assert used <= defined, f"{where}: undefined {used - defined}"


def test_dashboard_uses_only_schema_names():
    measurements = {m for m, _ in schema.FIELDS}
    for dash in _dashboards().values():
        for where, q in _queries(dash):
            for m in re.findall(r'FROM "(\w+)"', q):
                assert m in measurements, f"{where}: unknown measurement {m}"
            if q.startswith("SELECT"):
                (m,) = re.findall(r'FROM "(\w+)"', q)
                known = {f for mm, f in schema.FIELDS if mm == m} | set(schema.TAGS)
                for name in re.findall(r'"(\w+)"', q.split(" FROM ")[0]):
                    if not name.startswith(("peak_", "mean_")):
                        assert name in known, f"{where}: {m} has no field {name}"


def test_provider_path_is_where_dashboards_are_mounted():
    with open(PROVIDER) as f:
        (provider,) = yaml.safe_load(f)["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


# --- every query against the real influxd ------------------------------------------------

def _regex_escape(value: str) -> str:
    """Grafana's regex escaping of variable values for InfluxQL (kbn.regexEscape)."""
    return re.sub(r"([\\^$*+?.()|{}\[\]/])", r"\\\1", value)


def substitute(query: str, values: dict[str, list[str]]) -> str:
    """What Grafana sends: multi-value variables as ``(a|b)``, time macros filled in."""
    query = query.replace("$timeFilter", "time > now() - 1h").replace("$__interval", "10s")
    for name, vals in sorted(values.items(), key=lambda kv: -len(kv[0])):
        query = query.replace(f"${name}", "(" + "|".join(_regex_escape(v) for v in vals) + ")")
    return query


@pytest.fixture(scope="module")
def monitored(monitored_both):
    """Every test here runs on both runs: ``dag-tag`` true and false (conftest.py)."""
    return monitored_both


@pytest.mark.parametrize("name", list(_dashboards()))
def test_every_query_returns_rows(monitored, name):
    influxd = monitored.influxd
    dash = _dashboards()[name]
    values: dict[str, list[str]] = {}
    for var in dash["templating"]["list"]:  # in order: later variables use earlier ones
        rows = influxd.query(substitute(var["query"], values), db=monitored.database)
        assert rows, f"variable {var['name']}: no values"
        values[var["name"]] = sorted({r.get("value", r.get("distinct")) for r in rows})  # SHOW TAG VALUES, DISTINCT
    failures = []
    for where, q in _queries(dash):
        sent = substitute(q, values)
        assert "$" not in sent.replace("$/", "").replace("(,|$)", ""), sent
        if not influxd.query(sent, db=monitored.database):
            failures.append(f"{where}: {sent}")
    assert not failures, "queries without rows:\n" + "\n".join(failures)


def test_task_panels_return_rows(influxd):
    import task_points

    database = influxd.create_database("grafana_tasks")
    task_points.write_influxd(influxd, database)
    values = {"host": ["node1"], "worker": task_points.WORKERS, "job": ["1", "2"], "dag": ["1", "2", "3"]}
    panels = [p for p in _dashboards()["dask-influx-metrics.json"]["panels"]
              if re.search(r'FROM "(task|activity)"', p["targets"][0]["query"])]
    assert len(panels) == 2
    for panel in panels:
        sent = substitute(panel["targets"][0]["query"], values).replace("now() - 1h", str(task_points.T0))
        rows = influxd.query(sent, db=database)
        assert {r["job"] for r in rows} == {"1", "2"}, sent


def test_build_script_runs(tmp_path):
    """The generator is a plain script (python grafana/build_dashboard.py)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", "import build_dashboard as b; print(len(b.panels()))"],
                         cwd=GRAFANA, env=env, capture_output=True, text=True, timeout=60)
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
    options = {"strict": True, "noEmit": True, "module": "esnext", "moduleResolution": "bundler",
               "target": "es2022", "skipLibCheck": True, "types": [],
               "paths": {"@grafana/schema": [os.path.join(GRAFANA_TOOLS, "@grafana", "schema")]}}
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
