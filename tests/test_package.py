"""The package as a user gets it: ``python -m build`` makes a wheel and an sdist, each installs in a
fresh virtual environment and passes a smoke test there (import, CLI ``--help``, one monitored run)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest
import tomllib
from freshvenv import fresh_venv

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
SMOKE = r"""
import os, sys, tempfile
import dask_influx_metrics
from dask_influx_metrics import Monitor, query
assert dask_influx_metrics.__file__.startswith(sys.prefix), dask_influx_metrics.__file__
from distributed import Client, LocalCluster
spool = tempfile.mkdtemp()
with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster, \
        Client(cluster) as client:
    monitor = Monitor(client, sink="spool", spool_directory=spool, gpu_source="simulated", gpu_count=1)
    monitor.attach(polling_interval=50)
    monitor.start()
    client.gather(client.map(lambda x: sum(range(10**6)) + x, range(8)))
    monitor.stop()
db = query.connect(spool)
assert db.jobs() == [1], db.jobs()
assert len(next(iter(query.worker_tables(db).values()))) > 0
import shutil; shutil.rmtree(spool)
print("smoke ok")
"""


def _metadata() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def test_classifiers_are_ones_pypi_accepts():
    from trove_classifiers import classifiers

    assert set(_metadata()["classifiers"]) <= classifiers


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, str]:
    """``python -m build`` (isolated: setuptools comes from the package index) -> {"wheel", "sdist"}."""
    pytest.importorskip("build", reason="pip install build (a test extra)")
    out = tmp_path_factory.mktemp("dist")
    run = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), ROOT], capture_output=True, text=True, timeout=300
    )
    if run.returncode != 0 and "Could not find a version that satisfies" in run.stdout + run.stderr:
        pytest.skip("python -m build cannot install setuptools into its isolated environment (offline, no local index)")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    files = os.listdir(out)
    return {
        "wheel": str(out / next(f for f in files if f.endswith(".whl"))),
        "sdist": str(out / next(f for f in files if f.endswith(".tar.gz"))),
    }


def test_wheel_holds_the_settings_file_and_the_typed_marker(dist):
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    assert {"dask_influx_metrics/influx-metrics.yaml", "dask_influx_metrics/py.typed"} <= set(names)
    meta = zipfile.ZipFile(dist["wheel"]).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Provides-Extra: nvml" in meta and "License-Expression: Apache-2.0" in meta


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_built_package_installs_in_a_fresh_venv_and_runs(dist, kind, tmp_path):
    """The dependencies come from this test environment (a .pth line, nothing downloaded); the
    package itself only from the built file. Runs outside the repository so nothing of it is imported."""
    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    # the sdist is built by pip in an isolated environment, setuptools from the index as for `build`
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", dist[kind]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    cli = subprocess.run(
        [str(venv / "bin" / "dask-influx-metrics"), "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert cli.returncode == 0 and "Usage" in cli.stdout, cli.stderr
    smoke = subprocess.run([python, "-c", SMOKE], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert smoke.returncode == 0 and "smoke ok" in smoke.stdout, smoke.stdout[-2000:] + smoke.stderr[-3000:]
