"""The agent's /metrics (agent/prometheus.py): names and units, labels, the series count, a port in use."""

from __future__ import annotations

import socket
import urllib.request

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from dask_influx_metrics.agent import prometheus as P  # noqa: E402
from dask_influx_metrics.config import Settings  # noqa: E402
from dask_influx_metrics.link.snapshot import Snapshot  # noqa: E402
from dask_influx_metrics.sampling.accounting import Accounting  # noqa: E402

STEP = 0.2
LABELS = {"host": "node", "session": "20261128T120000-000001"}


def fed(gpus=2, jobs=3, samples=5) -> Accounting:
    """An agent's accounting after ``samples`` samples: ``jobs`` workers, each running its own job on each of
    ``gpus`` shared GPUs (a share every sample)."""
    acc = Accounting(10.0, STEP, {"host": "node", "worker": "agent-node"}, since_ns=0)
    workers = [
        (f"w{j}", f"tcp://w:{j}", Snapshot(((f"k{j}", j, 1),), 1, 0, j), {"cpu_percent": 50.0})
        for j in range(1, jobs + 1)
    ]
    for k in range(samples):
        devices = [
            (
                f"GPU-{g}",
                {
                    "utilization_gpu": 90.0,
                    "sm_active": 60.0,
                    "pipe_tensor_active": 30.0,
                    "memory_used": 1024.0,
                    "memory_total": 81920.0,
                    "power_draw": 300.0,
                    "temperature_gpu": 50.0,
                },
                {"index": str(g), "uuid": f"GPU-{g}", "nvml_index": str(g)},
                [(w[0], {"worker_gpu_share": 100.0 / jobs, "worker_memory_used": 256.0}) for w in workers],
            )
            for g in range(gpus)
        ]
        acc.update(int(k * STEP * 1e9), int(k * STEP * 1e9), devices, workers)
    return acc


def scrape(collector) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_names_units_and_labels_follow_prometheus_practice():
    collector = P.AccountingCollector(fed(), LABELS)
    scrape(collector)  # the first scrape of each new series shows its counters at 0
    families = scrape(collector)
    busy = families["dask_job_gpu_busy_seconds"]
    assert busy.type == "counter" and {s.name for s in busy.samples} == {"dask_job_gpu_busy_seconds_total"}
    labels = {tuple(sorted(s.labels)) for f in families.values() for s in f.samples}
    assert {name for names in labels for name in names} <= {
        "host",
        "session",
        "uuid",
        "gpu",
        "worker",
        "dask_job",
        "name",
    }
    assert all("host" in names and ("session" in names) == ("dask_job" in names) for names in labels)
    assert set(families["dask_gpu_info"].samples[0].labels) == {"host", "uuid", "gpu", "name"}
    one = {s.labels["dask_job"]: s.value for s in busy.samples if s.labels["uuid"] == "GPU-0"}
    assert one["1"] == pytest.approx(0.9 * 5 * STEP / 3) and "idle" in one
    ratio = families["dask_gpu_utilization_ratio"].samples[0]
    assert ratio.value == pytest.approx(0.9) and families["dask_gpu_memory_used_bytes"].samples[0].value == 2**30
    share = {s.labels["worker"]: s.value for s in families["dask_gpu_worker_share_ratio"].samples}
    assert share["tcp://w:1"] == pytest.approx(1 / 3)
    for f in families.values():
        assert f.type in ("counter", "gauge") and f.documentation, f.name
        assert f.type != "counter" or all(s.name.endswith("_total") for s in f.samples), f.name


def test_a_new_series_shows_0_at_its_first_scrape_so_increase_counts_its_start():
    collector = P.AccountingCollector(fed(jobs=1), LABELS)
    first = scrape(collector)["dask_job_gpu_busy_seconds"].samples
    assert {s.value for s in first} == {0.0}
    assert all(
        s.value > 0 for s in scrape(collector)["dask_job_gpu_busy_seconds"].samples if s.labels["dask_job"] == "1"
    )


def test_series_count_formula_bounds_what_is_served():
    collector = P.AccountingCollector(fed(gpus=8, jobs=16, samples=2), LABELS)
    served = sum(len(f.samples) for f in scrape(collector).values())
    most = P.series_count(gpus=8, jobs=16, workers_x_gpus=16 * 8)
    assert most - 8 * 3 - 1 == served, "all but the idle rows' memory, gpu_seconds and CPU (all busy)"


def test_serves_metrics_and_a_port_in_use_is_said_once_and_sampling_goes_on():
    said = []
    report = lambda what, message, key=None: said.append(message)  # noqa: E731
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings.resolve({"prometheus.port": port, "prometheus.address": "127.0.0.1"})
    endpoint = P.serve(settings, fed(), LABELS, report)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert b"dask_job_gpu_busy_seconds_total" in r.read()
        assert P.serve(settings, fed(), LABELS, report) is None  # the port is held now
        assert len(said) == 1 and f"prometheus.port {port}" in said[0] and "sampling goes on" in said[0]
    finally:
        endpoint.close()
    assert P.serve(Settings.resolve({}), fed(), LABELS, report) is None, "off by default"


def test_without_prometheus_client_the_extra_is_named(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_client(name, *args, **kwargs):
        if name.startswith("prometheus_client"):
            raise ImportError("No module named 'prometheus_client'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_client)
    said = []
    settings = Settings.resolve({"prometheus.port": 9847})
    assert P.serve(settings, fed(), LABELS, lambda what, message, key=None: said.append(message)) is None
    assert "pip install 'dask-influx-metrics[prometheus]'" in said[0]
