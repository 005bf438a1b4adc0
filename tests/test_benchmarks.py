"""Smoke test: the benchmark runner and its cheaper modules still run (targets are not asserted)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_benchmarks_run(tmp_path):
    out = tmp_path / "bench.json"
    only = "sampler,encode,memory,query,hostonce,live"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", only, "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert not result["crashed"]
    names = {r["name"] for r in result["rows"]}
    assert names == {"sampler", "encode", "memory", "query", "hostonce", "live"}
    assert all(r["measured"] is not None for r in result["rows"])


def test_median_interval_is_the_sign_tests():
    """The order statistics whose binomial coverage reaches 95 %: [2nd, 8th] of 9, [min, max] of 6, none of 5."""
    from benchmarks.common import median_interval

    assert median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5]) == (2, 8)
    assert median_interval(range(6)) == (0, 5)
    assert median_interval(range(24)) == (6, 17)  # P(X <= 6) = 0.011 per tail; P(X <= 7) = 0.032 is too wide
    assert median_interval(range(5)) is None
    assert median_interval(range(9), level=0.8) == (2, 6)  # 82 %


def test_gpu_source_nvml_runs_or_skips_cleanly(tmp_path):
    from dask_influx_metrics.sampling.sources.nvml_devices import nvml_available

    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            "sampler",
            "--gpu-source",
            "nvml",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    if nvml_available():
        assert all(r["measured"] is not None for r in rows)
    else:
        assert [r["what"] for r in rows] == ["skipped: --gpu-source nvml, but NVML sees no GPU here"]


def test_gpu_source_nvml_reads_the_replayed_h100(tmp_path):
    """``--gpu-source nvml`` end to end where NVML answers as the recorded H100 did: the sampler and gaps
    benchmarks sample it (the benchmark process, its workers and their agent all import the shim).
    ``workload`` builds its monitors with the same ``common.gpu_settings()`` as ``gaps``; run by hand
    (~70 s more) it passes too."""
    from nvml_shim import replay_env

    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(replay_env(tmp_path, worker_pid=1))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            "sampler,gaps",
            "--gpu-source",
            "nvml",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert not result["crashed"] and {r["name"] for r in rows} == {"sampler", "gaps"}
    assert all(r["measured"] is not None and not r["what"].startswith("skipped") for r in rows), rows
    assert not any("simulated" in r["what"] + r["notes"] for r in rows), "every row names NVML's GPUs"
    assert sum("NVML" in r["what"] + r["notes"] for r in rows) >= 3
