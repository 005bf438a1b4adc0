"""Every Python and shell block of README.md and docs/*.md runs, as written (issue 24).

Python blocks of one file run in order in one namespace, on a real LocalCluster (two worker
processes, simulated GPUs from the environment, as a user without a GPU would try it). Shell
blocks run line by line: ``dask-influx-metrics ...`` through the CLI itself (click's runner), the
README's install block in its own test (a wheel built and installed into a fresh venv). A block
that cannot run here says why in a ``<!-- docs-test: skip (why) -->`` line just above it.

Addresses the docs give as examples are rewritten to this test's servers (:data:`REWRITES`):
the scheduler, InfluxDB (the session's influxd, whose UDP listener stands in for Telegraf) and
the spool root. The data read back comes from a monitored run tagged ``run=nightly`` with two
manual jobs, written over UDP into influxd and into a spool (``documented`` below).
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

import pytest
import tomllib
from click.testing import CliRunner
from fluxcheck import ROOT
from freshvenv import fresh_venv

from dask_influx_metrics import Monitor, query
from dask_influx_metrics.client.cli import cli
from dask_influx_metrics.sinks.spool import read_lines

FENCE = re.compile(r"^(?:<!-- docs-test: (\w+)(?: \((.*?)\))? -->\n)?```(\w+)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
RUN = ("python", "bash")
OWN_TESTS = {"custom-metrics.md"}  # pages whose examples a test of their own runs (test_docs_custom_metrics.py)
PAGES = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md") and f not in OWN_TESTS
)
# the only blocks allowed not to run: (page, first line); faults.md's are minutes long and mount tmpfs as root
# (tests/test_faults.py runs the same scenarios scaled down)
SKIPPED = {("README.md", "./scripts/demo.sh"), ("docs/faults.md", "unshare")}


def blocks(page: str) -> list[dict]:
    """The ``python`` and ``bash`` blocks of ``page``: line, language, body, marker, reason."""
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    return [
        {
            "line": text.count("\n", 0, m.start()) + 1 + bool(m.group(1)),
            "language": m.group(3),
            "body": m.group(4),
            "marker": m.group(1),
            "reason": m.group(2),
        }
        for m in FENCE.finditer(text)
        if m.group(3) in RUN
    ]


def test_every_runnable_block_runs_or_says_why_not():
    found = {(page, b["body"].split("\n", 1)[0].split()[0]): b for page in PAGES for b in blocks(page)}
    skipped = {k for k, b in found.items() if b["marker"] == "skip"}
    assert skipped == SKIPPED and all(found[k]["reason"] for k in skipped)
    assert {b["marker"] for b in found.values()} <= {None, "skip", "install"}
    assert sum(1 for page in PAGES for b in blocks(page) if b["language"] == "python") >= 3


@pytest.fixture(scope="module")
def doc_cluster(tmp_path_factory):
    """A LocalCluster whose workers (and this client) see simulated GPUs and a private spool root."""
    from distributed import LocalCluster

    spool = tmp_path_factory.mktemp("docs-spool")
    env = {
        "DASK_INFLUX_METRICS__GPU__SOURCE": "simulated",
        "DASK_INFLUX_METRICS__GPU__COUNT": "2",
        "DASK_INFLUX_METRICS__SPOOL__DIRECTORY": str(spool),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import dask.config

    dask.config.refresh()
    try:
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster:
            yield cluster, str(spool)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        dask.config.refresh()


@pytest.fixture(scope="module")
def documented(doc_cluster, influxd):
    """The run the docs' examples read: two manual jobs on both workers, tagged run=nightly, into
    influxd over UDP and into the spool; returns the stopped Monitor and the rewrites."""
    from distributed import Client

    cluster, spool = doc_cluster
    client = Client(cluster)
    monitor = Monitor(
        client, sink=["udp", "spool"], telegraf_address="%s:%d" % influxd.udp_address, tags={"run": "nightly"}
    )
    monitor.attach(job_type="manual", polling_interval=50)
    session = monitor.start()
    for _ in (1, 2):
        monitor.new_job()
        client.gather(client.map(time.sleep, [0.3] * 8, pure=False))  # a builtin: workers import it
    monitor.stop()
    spooled = sum(line.startswith(b"gpu,") for line in read_lines(os.path.join(spool, session["id"])))
    influxd.wait_for("SELECT count(\"utilization_gpu\") FROM \"gpu\" WHERE \"run\" = 'nightly'", 1, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # UDP: every spooled gpu point has reached influxd
        rows = influxd.query("SELECT count(\"utilization_gpu\") FROM \"gpu\" WHERE \"run\" = 'nightly'")
        if rows and rows[0]["count"] >= spooled:
            break
        time.sleep(0.2)
    rewrites = {
        "tcp://scheduler:8786": cluster.scheduler_address,
        "http://influx:8086": influxd.url,
        "http://127.0.0.1:8086": influxd.url,
        "/tmp/dask-influx-metrics-1000": spool,
    }
    yield monitor, rewrites
    monitor.shutdown()
    client.close()


def _rewrite(text: str, rewrites: dict) -> str:
    for old, new in rewrites.items():
        text = text.replace(old, new)
    return text


def _run_blocks(page: str, namespace: dict, rewrites: dict) -> int:
    """Run the page's blocks in the order a reader does; returns how many shell lines ran."""
    ran = 0
    for b in blocks(page):
        if b["marker"] is not None:
            continue
        if b["language"] == "python":
            exec(compile(_rewrite(b["body"], rewrites), f"{page}:{b['line']}", "exec"), namespace)
            continue
        for line in b["body"].splitlines():
            words = shlex.split(_rewrite(line, rewrites), comments=True)
            assert words[:1] == ["dask-influx-metrics"], f"{page}:{b['line']}: a shell line this test cannot run"
            result = CliRunner().invoke(cli, words[1:])
            assert result.exit_code == 0, f"{page}:{b['line']}: {line}\n{result.output}"
            ran += 1
    return ran


@pytest.mark.parametrize("page", [p for p in PAGES if p != "README.md"])
def test_docs_page_blocks_run(page, documented, tmp_path, monkeypatch):
    monitor, rewrites = documented
    monkeypatch.chdir(tmp_path)  # out/, gpu-report.html, lines.png land here
    _run_blocks(page, {"monitor": monitor}, rewrites)


def test_readme_use_and_analyze_blocks_run(documented, doc_cluster, tmp_path, monkeypatch):
    """The README's "Use" starts its own session (default sink: the spool), then "Analyze" and the
    shell lines read it back, also through the scheduler's address; then ``shutdown()``."""
    _, rewrites = documented
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    try:
        assert _run_blocks("README.md", namespace, rewrites) == 3
        assert namespace["session"]["destinations"] and [os.path.basename(p) for p in namespace["paths"]] == [
            "worker_0.csv",
            "worker_1.csv",
            "workers.csv",
        ]
        with pytest.raises(RuntimeError, match="no monitor is attached"):  # shutdown() removed it
            namespace["monitor"].jobs()
        # The first example's tracking collects every section of the report: no "add `...` to tracking"
        spool, session = doc_cluster[1], namespace["session"]["id"]  # a configured spool folder stays
        with query.connect(spool, session=session) as db:
            assert not query.tasks(db).empty and not query.activity(db).empty
            report = pathlib.Path(query.report(db, tmp_path / "r.html")).read_text(encoding="utf-8")
        assert "Slowest task prefixes" in report and re.findall(r"no [\w ]+ recorded: add [^<]*", report) == []
        for command in ("tasks", "activity"):  # the CLI agrees
            result = CliRunner().invoke(cli, [command, "--source", spool, "--session", session])
            assert result.exit_code == 0 and "sum" in result.stdout, result.output
    finally:
        if "monitor" in namespace:
            namespace["monitor"].shutdown()
            namespace["client"].close()


def test_readme_install_builds_a_wheel_that_installs_with_its_extras(tmp_path):
    """The README's install commands, into a fresh venv: nothing downloaded (``--no-index``); the
    dependencies and the ``[nvml]`` extra are those this test environment already has (a path line)."""
    (install,) = [b for b in blocks("README.md") if b["marker"] == "install"]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    wheel = f"dist/dask_influx_metrics-{version}-py3-none-any.whl"
    assert wheel in install["body"], "the README names the wheel this version builds"
    venv, dist = tmp_path / "venv", tmp_path / "dist"
    python = fresh_venv(venv)
    for line in install["body"].splitlines():
        words = shlex.split(line, comments=True)
        assert words[:3] == ["python", "-m", "pip"] or words[:3] == ["python", "-m", "build"], line
        if words[2] == "build":  # in the checkout, as the README says; the wheel into this test's folder
            command = [sys.executable, "-m", "build", *words[3:], "--outdir", str(dist), ROOT]
        else:
            command = [
                sys.executable,
                "-m",
                "pip",
                "--python",
                python,
                "install",
                "--no-index",
                "--find-links",
                str(dist),
                *(w.replace("dist/", f"{dist}/") for w in words[4:]),
            ]
        run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        if (
            run.returncode
            and "Could not find a version that satisfies" in run.stdout + run.stderr
            and words[2] == "build"
        ):
            pytest.skip("python -m build cannot install setuptools into its isolated environment (offline)")
        assert run.returncode == 0, f"{line}\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
    check = subprocess.run(
        [
            python,
            "-c",
            "import dask_influx_metrics, pynvml, sys; "
            "assert dask_influx_metrics.__file__.startswith(sys.prefix); print('ok')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert check.stdout.strip() == "ok", check.stderr[-2000:]
