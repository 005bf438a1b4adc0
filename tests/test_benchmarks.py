"""Smoke test: the benchmark runner and its cheaper modules still run (targets are not asserted)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_benchmarks_run(tmp_path):
    out = tmp_path / "bench.json"
    only = "sampler,encode,memory,query,hostonce"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", only,
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert not result["crashed"]
    names = {r["name"] for r in result["rows"]}
    assert names == {"sampler", "encode", "memory", "query", "hostonce"}
    assert all(r["measured"] is not None for r in result["rows"])


def test_gpu_source_nvml_runs_or_skips_cleanly(tmp_path):
    from dask_influx_metrics.worker.sources.nvml import nvml_available

    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "sampler", "--gpu-source", "nvml",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    if nvml_available():
        assert all(r["measured"] is not None for r in rows)
    else:
        assert [r["what"] for r in rows] == ["skipped: --gpu-source nvml, but NVML sees no GPU here"]
