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

import pytest
from nvml_shim import replay_env
from test_sidecar import points, wait_until

from dask_influx_metrics.config import Settings
from dask_influx_metrics.worker.sources.gpuprocs import host_pid_problem
from dask_influx_metrics.worker.sidecar import Sidecar
from dask_influx_metrics.worker.sources.activity import TaskRegistry

TESTS = pathlib.Path(__file__).parent
RECORDING = json.loads((TESTS / "data" / "nvml_h100_shared.json").read_text())["devices"][0]
MIB = 2**20


@pytest.fixture
def replayed_h100(tmp_path, monkeypatch):
    for name, value in replay_env(tmp_path, worker_pid=os.getpid()).items():
        monkeypatch.setenv(name, value)
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
