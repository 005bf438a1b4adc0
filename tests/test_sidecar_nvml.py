"""The default GPU path end to end: a sidecar process reading NVML for its worker.

The sidecar (``sampler.isolate``, the default) imports ``pynvml`` in its own
process. Here that import finds a shim first on ``PYTHONPATH`` that replays the
recorded H100 shared by two processes (``tests/data/nvml_h100_shared.json``,
through ``tests/fake_nvml.py``), with the recorded 'matmul' process (pid 425,
4682 MiB) standing for this test process, the "worker" the sidecar samples.
"""

import json
import os
import pathlib
import sys

import pytest
from test_sidecar import points, wait_until

from dask_influx_metrics.config import Settings
from dask_influx_metrics.worker.sources.gpuprocs import host_pid_problem
from dask_influx_metrics.worker.sidecar import Sidecar
from dask_influx_metrics.worker.sources.activity import TaskRegistry

TESTS = pathlib.Path(__file__).parent
RECORDING = json.loads((TESTS / "data" / "nvml_h100_shared.json").read_text())["devices"][0]
MIB = 2**20

SHIM = '''"""Test shim: ``import pynvml`` replays a recording through tests/fake_nvml.py."""
import importlib.machinery, importlib.util, os, sys

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.machinery.PathFinder.find_spec("pynvml", [p for p in sys.path if os.path.abspath(p or ".") != here])
real = importlib.util.module_from_spec(spec)
sys.modules["pynvml"] = real  # what fake_nvml imports for NVML's constants and error classes
spec.loader.exec_module(real)
sys.path.insert(0, os.environ["FAKE_NVML_TESTS"])
from fake_nvml import FakeNvml

fake = FakeNvml("nvml_h100_shared.json")
for procs in fake.devices[0]["compute_processes"]:
    for p in procs:
        if p["pid"] == 425:
            p["pid"] = int(os.environ["FAKE_NVML_WORKER_PID"])
sys.modules["pynvml"] = fake  # what `import pynvml` returns to the sidecar
'''


@pytest.fixture
def replayed_h100(tmp_path, monkeypatch):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text(SHIM)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shim), *sys.path]))
    monkeypatch.setenv("FAKE_NVML_TESTS", str(TESTS))
    monkeypatch.setenv("FAKE_NVML_WORKER_PID", str(os.getpid()))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_the_sidecar_reads_nvml_for_its_worker(tmp_path, replayed_h100):
    spool = tmp_path / "spool"
    settings = Settings.resolve({"sink": "spool", "spool.directory": str(spool), "gpu.source": "nvml",
                                 "polling-interval": 50, "spool.flush-interval": 0.1})
    registry = TaskRegistry(nthreads=1)
    registry.started(("matmul", 0), 3, 8)
    sidecar = Sidecar(settings, "s-nvml", "tcp://w:1", {"host": "h", "worker": "tcp://w:1"}, registry.snapshot())
    try:
        assert sidecar.wait_ready(30), "the sidecar started with the replayed NVML"
        wait_until(lambda: len(points(spool, "gpu")) >= 3, what="3 flushed GPU samples")
    finally:
        assert sidecar.close() == 0
    gpu = points(spool, "gpu")
    assert {p.tags["uuid"] for p in gpu} == {RECORDING["uuid"]}
    assert {(p.tags["job"], p.tags["dag"]) for p in gpu} == {("3", "8")}, "the worker's task, from shared memory"
    recorded = {u["gpu"] for u in RECORDING["utilization"]}
    assert {p.fields["utilization_gpu"] for p in gpu} <= recorded
    assert all(p.fields["memory_used"] > 0 and p.fields["power_draw"] > 0 for p in gpu)
    if host_pid_problem() is None:  # NVML lists host PIDs: only in the initial PID namespace
        assert {p.fields["worker_memory_used"] for p in gpu} == {4909432832 / MIB}, \
            "the worker's own process (recorded: 4682 MiB), not the other process on the GPU"
