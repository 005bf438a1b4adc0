"""deploy/: compose and Kubernetes files validate, mounts agree, no secrets, CQs run on influxd."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
COMPOSE = os.path.join(DEPLOY, "compose", "compose.yaml")
BIN = os.path.dirname(sys.executable)
GRAFANA_MOUNTS = {"/etc/grafana/provisioning/datasources", "/etc/grafana/provisioning/dashboards",
                  "/var/lib/grafana/dashboards"}


def _tool(name: str) -> str:
    path = os.path.join(BIN, name)
    if not os.path.exists(path) and not shutil.which(name):
        pytest.skip(f"{name} not installed (pip install {name})")
    return path if os.path.exists(path) else shutil.which(name)


def _k8s_docs() -> list[dict]:
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        kust = yaml.safe_load(f)
    docs = []
    for name in kust["resources"] + ["dask-example.yaml"]:
        with open(os.path.join(K8S, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def test_compose_validates_against_compose_spec():
    out = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", COMPOSE],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_pins_images_and_mounts_what_exists():
    with open(COMPOSE) as f:
        services = yaml.safe_load(f)["services"]
    for name, svc in services.items():
        image = svc["image"]
        assert ":" in image and not image.endswith((":latest", ":2")), f"{name}: pin {image}"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert os.path.exists(os.path.join(DEPLOY, "compose", source)), f"{name}: {source} missing"
    assert "8094:8094/udp" in services["telegraf"]["ports"]
    targets = {v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert "/etc/grafana/provisioning" in targets and "/var/lib/grafana/dashboards" in targets


def test_kubernetes_manifests_validate_strictly():
    files = [os.path.join(K8S, n) for n in ("influxdb.yaml", "telegraf.yaml", "grafana.yaml", "dask-example.yaml")]
    out = subprocess.run([_tool("kubernetes-validate"), "--strict", *files], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_kustomization_generates_every_configmap_used():
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        kust = yaml.safe_load(f)
    generated = {g["name"] for g in kust["configMapGenerator"]}
    for g in kust["configMapGenerator"]:
        for entry in g["files"]:
            assert os.path.exists(os.path.join(K8S, entry.split("=")[-1])), entry
    used, mounts = set(), set()
    for doc in _k8s_docs():
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        used |= {v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v}
        for c in spec.get("containers", []):
            if c["name"] == "grafana":
                mounts |= {m["mountPath"] for m in c.get("volumeMounts", [])}
    assert used <= generated
    assert mounts == GRAFANA_MOUNTS


def test_kubernetes_telegraf_and_workers_meet_on_host_port():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _k8s_docs()}
    (telegraf,) = docs["DaemonSet", "telegraf"]["spec"]["template"]["spec"]["containers"]
    assert {"containerPort": 8094, "hostPort": 8094, "protocol": "UDP"}.items() <= telegraf["ports"][0].items()
    for name in ("dask-scheduler", "dask-worker"):
        (c,) = docs["Deployment", name]["spec"]["template"]["spec"]["containers"]
        assert "--preload" in c["args"] and "dask_influx_metrics.preload" in c["args"]
        env = {e["name"]: e for e in c["env"]}
        assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
        assert env["DASK_INFLUX_METRICS__TELEGRAF__ADDRESS"]["value"] == "$(HOST_IP):8094"


SECRET_KEY = re.compile(r"(token|password|secret)[\w-]*['\"]?\s*[:=]\s*(.*)$", re.I)
ALLOWED = re.compile(r"^(Token |Bearer )?(\$\{\w+(:[?-][^}]*)?\}|\$\(\w+\))?$")


def _secret_values(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every token/password/secret given a literal value."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        m = SECRET_KEY.search(line.split(" #", 1)[0].strip().lstrip("#").strip())
        if not m:
            continue
        value = m.group(2).strip().strip("\"'")
        if value.startswith(("{", "[", "valueFrom", "$(", "influxdb-auth")) or ALLOWED.match(value):
            continue  # a reference: ${VAR}, secretKeyRef, generated at install time
        found.append((number, line.strip()))
    return found


def test_secret_checker_catches_literals():
    assert _secret_values('token = "abc123"\npassword: hunter2\nINFLUX_TOKEN=s3cret') == [
        (1, 'token = "abc123"'), (2, "password: hunter2"), (3, "INFLUX_TOKEN=s3cret")]
    assert _secret_values('token = "${INFLUX_TOKEN}"\nINFLUX_TOKEN=\npassword: ${P:?set}') == []


def test_no_secret_values_committed():
    found = []
    for top in ("deploy", "grafana"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".json", ".py", ".md")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    found += [f"{os.path.relpath(path, ROOT)}:{n}: {line}" for n, line in _secret_values(f.read())]
    assert not found, "secret-looking values:\n" + "\n".join(found)


def test_continuous_queries_run_on_influxd(influxd):
    """Every 1.x statement succeeds, and the CQ's SELECT INTO downsamples real points."""
    db = "cq_" + uuid.uuid4().hex[:10]
    with open(os.path.join(DEPLOY, "influxdb", "continuous-queries.influxql")) as f:
        statements = [s.replace('"dask_metrics"', f'"{db}"') for s in f.read().splitlines()
                      if s.strip() and not s.startswith("--")]
    assert any(s.startswith("CREATE CONTINUOUS QUERY") for s in statements)
    for s in statements:
        influxd.query(s, db=db)
    cqs = {row["name"] for row in influxd.query("SHOW CONTINUOUS QUERIES", db=db)}
    assert "dask_metrics_1m" in cqs
    t0 = (time.time_ns() // 60_000_000_000 - 2) * 60_000_000_000  # a minute boundary, 2 min ago
    influxd.write([f"gpu,worker=w,index=0 utilization_gpu=10,memory_used=5 {t0}",
                   f"gpu,worker=w,index=0 utilization_gpu=30,memory_used=7 {t0 + 10**9}"], db=db)
    (cq,) = [s for s in statements if s.startswith("CREATE CONTINUOUS QUERY")]
    select = cq.split(" BEGIN ", 1)[1].rsplit(" END", 1)[0]
    select = select.replace(" GROUP BY", f" WHERE time >= {t0} AND time < {t0 + 60_000_000_000} GROUP BY")
    influxd.query(select, db=db)
    (row,) = influxd.query(f'SELECT * FROM "{db}"."downsampled_1m"."gpu"', db=db)
    assert row["mean_utilization_gpu"] == 20 and row["mean_memory_used"] == 6
