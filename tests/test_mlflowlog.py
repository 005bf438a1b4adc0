"""The per-node summary into MLflow (issue 47), written to MLflow's local file store and read back with MLflow's own
client: every logged metric equals the summary's figure, node as the step, each job in a child run."""

from __future__ import annotations

import builtins
import math

import node_points as NP
import pytest

from dask_influx_metrics import query
from dask_influx_metrics.client import mlflowlog

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    with query.connect(NP.write_spool(tmp_path_factory.mktemp("nodes"))) as store:
        yield store


@pytest.fixture
def store_uri(tmp_path, monkeypatch):
    # MLflow 3.x refuses its file store unless asked (it prefers a database: sqlite needs the full mlflow package)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def _expected(frame, job) -> dict:
    """{logged name: value} from the summary rows themselves, by the REFERENCE and GPU tables."""
    rows = frame[frame["job"].isna() if job is None else frame["job"] == job]
    out = {}
    for n in mlflowlog.NAMES:
        if n.resource == "gpu":
            mine = rows[(rows["resource"] == "gpu") & (rows["worker"] == "all workers")]
        else:
            mine = rows[(rows["resource"] == n.resource) & rows["worker_index"].notna()]
        if len(mine) and not math.isnan(float(mine[n.column].iloc[0])):
            out[n.logged] = float(mine[n.column].iloc[0]) * n.scale
    return out


def _read(client, run_id) -> dict:
    """{(name, step): value} of every metric of the run, from its history (every step)."""
    run = client.get_run(run_id)
    return {(m.key, m.step): m.value for key in run.data.metrics for m in client.get_metric_history(run_id, key)}


def test_every_logged_metric_reads_back_equal_to_the_summary(db, store_uri):
    client = mlflow.MlflowClient(store_uri)
    out = mlflowlog.log_summary(db, tracking_uri=store_uri)
    assert out["nodes"] == ["node-a", "node-b"] and sorted(out["jobs"]) == [1, 2]
    summaries = mlflowlog.summaries(db)
    for run_id, job in [(out["run_id"], None), *[(r, j) for j, r in out["jobs"].items()]]:
        got = _read(client, run_id)
        want = {
            (k, step): v for step, node in enumerate(out["nodes"]) for k, v in _expected(summaries[node], job).items()
        }
        assert got == want
        run = client.get_run(run_id)
        assert run.data.tags["node.0"] == "node-a" and run.data.tags["node.1"] == "node-b"
        assert run.data.tags["dask_influx_metrics.job"] == ("all" if job is None else str(job))
        if job is not None:
            assert run.data.tags["mlflow.parentRunId"] == out["run_id"] and run.info.run_name == f"job {job}"
    # the hand-computed figures of tests/node_points.py, under the reference's names
    job2 = _read(client, out["jobs"][2])
    assert job2["total_disk_io_read_mb", 1] == 14  # node-b: its reboot's window left out
    assert job2["total_net_io_lo_sent_mb", 0] == 45 and job2["max_t_disk_usage_percent", 0] == 70
    assert job2["max_t_cpu_pct_per_cpu_max", 0] == 100 and job2["cpu_avg_utilization_pct", 0] == 50
    assert job2["node_gpu_count", 0] == 1 and job2["gpu_avg_utilization_pct", 0] == pytest.approx(90)
    job1 = _read(client, out["jobs"][1])
    assert ("cpu_avg_utilization_pct", 1) not in job1  # job 1 never ran on node-b: nothing logged for it
    assert job1["node_cpu_hours", 0] == pytest.approx(2 * 10 * NP.STEP / 1e9 / 3600)


def test_one_job_into_the_active_run(db, store_uri):
    mlflow.set_tracking_uri(store_uri)
    try:
        with mlflow.start_run() as run:
            out = mlflowlog.log_summary(db, job=1)
        assert out["run_id"] == run.info.run_id and out["jobs"] == {}
        got = _read(mlflow.MlflowClient(store_uri), run.info.run_id)
        assert got["max_t_mem_percent", 0] == 40 and ("max_t_mem_percent", 1) not in got
    finally:
        mlflow.set_tracking_uri(None)


def test_every_reference_name_is_documented_with_ours():
    import pathlib

    text = (pathlib.Path(__file__).parent.parent / "docs" / "mlflow.md").read_text()
    for n in mlflowlog.NAMES:
        assert f"| `{n.reference}` | `{n.logged}` | `{n.resource}` | `{n.column}` |" in text, n.reference


def test_missing_mlflow_names_the_extra(monkeypatch):
    real = builtins.__import__

    def no_mlflow(name, *args, **kw):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError("No module named 'mlflow'")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    with pytest.raises(ImportError, match=r"pip install dask-influx-metrics\[mlflow\]"):
        mlflowlog.require_mlflow()
