"""Tasks, activity and GPU use during tasks (client/tasks.py), from a real influxd (InfluxQL), a
spool written by the spool sink, and the Flux backend (a fake 2.x answering in annotated CSV), on
contract-shaped points (tests/task_points.py); ``dag`` as a tag and as a field."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import short_tasks
import task_points as P

from dask_influx_metrics import query
from dask_influx_metrics.client import tasks as T
from dask_influx_metrics.client.query import fluxtext as F

TASKS = [
    [1, "matmul", 4, 0, 2.0, 0.5],
    [1, "load", 6, 0, 0.6, 0.1],
    [2, "matmul", 10, 0, 2.0, 0.2],
    [2, "sum", 2, 2, 0.1, 0.05],
]  # DAG 3 ran on both workers
ACTIVITY = [
    [1, "load", "disk-read", "bytes", 1000.0],
    [1, "load", "thread-cpu", "seconds", 0.6],
    [1, "matmul", "thread-noncpu", "seconds", 0.5],
    [2, "matmul", "thread-cpu", "seconds", 1.0],
    [2, "sum", "idle", "seconds", 0.125],
]


@pytest.fixture(scope="module", params=[False, True], ids=["dag-tag", "dag-field"])
def stores(request, influxd, tmp_path_factory):
    database = influxd.create_database(f"tasks_{int(request.param)}_{id(request)}")
    P.write_influxd(influxd, database, dag_field=request.param)
    spool = P.write_spool(tmp_path_factory.mktemp("spool"), dag_field=request.param)
    out = {"influxql": query.connect(influxd.url, database=database), "spool": query.connect(spool)}
    yield out
    for db in out.values():
        db.close()


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_tasks_per_job_and_prefix(stores, kind):
    db = stores[kind]
    frame = query.tasks(db)
    assert list(frame.columns) == [c for c in T.TASKS if c != "dag"]
    got = frame[["job", "prefix", "tasks", "erred", "total_s", "max_s"]].values.tolist()
    assert [row[:4] for row in got] == [row[:4] for row in TASKS]
    assert [v for row in got for v in row[4:]] == pytest.approx([v for row in TASKS for v in row[4:]])
    assert frame["compute_s"].sum() == pytest.approx(0.75 * frame["total_s"].sum())
    assert frame["nbytes"].tolist() == [400, 600, 1000, 0]
    per_dag = query.tasks(db, per_dag=True)
    assert per_dag[["job", "dag", "prefix", "tasks"]].values.tolist() == [
        [1, 2, "matmul", 4],
        [1, 1, "load", 6],
        [2, 3, "matmul", 10],
        [2, 3, "sum", 2],
    ]
    assert query.tasks(db, job=2)["prefix"].tolist() == ["matmul", "sum"]
    stream = query.task_stream(db, job=1)
    assert len(stream) == 10 and set(stream["dag"]) == {1, 2} and stream["key"].str.contains("-abc").all()
    with pytest.raises(ValueError, match=r"no job 7; jobs: \[1, 2\]"):
        query.tasks(db, job=7)


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_activity_breakdown(stores, kind):
    frame = query.activity(stores[kind])
    assert list(frame.columns) == T.ACTIVITY
    got = frame.values.tolist()
    assert [row[:4] for row in got] == [row[:4] for row in ACTIVITY]
    assert [row[4] for row in got] == pytest.approx([row[4] for row in ACTIVITY])
    assert query.activity(stores[kind], job=2)["prefix"].tolist() == ["matmul", "sum"]


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_gpu_utilization_during_tasks(stores, kind):
    frame = query.gpu_during_tasks(stores[kind])
    assert list(frame.columns) == T.GPU + ["mean_device_utilization_gpu", "max_device_utilization_gpu"]
    # no worker_gpu_share written: no GPU was shared, so each job's own figures are the device's
    assert frame["mean_utilization_gpu"].tolist() == frame["mean_device_utilization_gpu"].tolist()
    rows = frame[["job", "dag", "samples", "mean_utilization_gpu"]].astype(object).where(frame.notna(), None)
    assert rows.values.tolist() == [
        [1, None, 40, 80.0],
        [1, 1, 20, 80.0],
        [1, 2, 20, 80.0],
        [2, None, 40, 40.0],
        [2, 3, 40, 40.0],
    ]
    assert query.gpu_during_tasks(stores[kind], job=2)["samples"].tolist() == [40, 40]


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_dags_read_alike_with_dag_as_tag_or_field(stores, kind):
    dags = stores[kind].dags()
    assert dags[["dag", "job", "status"]].values.tolist() == [[1, 1, "ok"], [2, 1, "ok"], [3, 2, "erred"]]


def test_nothing_recorded_says_why(influxd, tmp_path):
    database = influxd.create_database("tasks_none")
    points = [p for p in P.all_points() if p.measurement not in ("task", "activity")]
    from dask_influx_metrics import lineprotocol

    influxd.write(lineprotocol.encode_many(points), db=database).raise_for_status()
    with query.connect(influxd.url, database=database) as db:
        assert query.tasks(db).empty and "add `task-stream` to tracking" in query.tasks(db).attrs["why"]
        assert query.activity(db).empty and "add `fine-metrics` to tracking" in query.activity(db).attrs["why"]
        assert len(query.gpu_during_tasks(db)) == 5


# --- Flux: the same answers through influxdb-client and a fake InfluxDB 2.x -----------------
def test_flux_points_query_passes_the_flux_language_server():
    fluxcheck = pytest.importorskip("fluxcheck")
    sources = {
        m: F.flux_points_query("b", m, cols, {"run": "x"}, start_ns=1, stop_ns=2)
        for m, cols in (("task", T.TASK_COLUMNS), ("activity", T.ACTIVITY_COLUMNS))
    }
    assert fluxcheck.flux_diagnostics(sources) == {"task": [], "activity": []}


def fake_flux(points, measurements, canned):
    """A fake InfluxDB 2.x answering Flux: the recorded answer ``ANSWERS[name]`` to a query holding
    ``marker`` (``canned``: ``(marker, name)`` pairs), else the ``points`` of the measurement asked for."""
    from fake_influx2 import ANSWERS, FakeInflux

    def answer(flux):
        for marker, name in canned:
            if marker in flux:
                return 200, ANSWERS[name]
        for m in measurements:
            if f'r._measurement == "{m}"' in flux:
                return 200, P.flux_answer([p for p in points if p.measurement == m])
        return 200, "\r\n"

    fake = FakeInflux()
    fake.answer = answer
    return fake


def test_flux_backend_reads_tasks_and_activity():
    pytest.importorskip("influxdb_client")
    points = P.all_points(dag_field=True)
    fake = fake_flux(points, ("task", "activity"), canned=(("buckets()", "buckets"),))
    try:
        with query.connect(fake.url, database="dask_metrics", language="flux", org="o", token="t") as db:
            tasks = query.tasks(db)
            assert tasks[["job", "prefix", "tasks", "erred"]].values.tolist() == [r[:4] for r in TASKS]
            assert tasks["total_s"].tolist() == pytest.approx([r[4] for r in TASKS])
            activity = query.activity(db)
            assert [r[:4] for r in activity.values.tolist()] == [r[:4] for r in ACTIVITY]
            assert query.task_stream(db)["time"].is_monotonic_increasing
    finally:
        fake.stop()


def test_summaries_of_no_points_are_empty_with_a_reason():
    assert T.summarize_tasks(pd.DataFrame()).attrs["why"] == T.NO_TASK_STREAM
    assert T.summarize_activity(pd.DataFrame()).attrs["why"] == T.NO_FINE_METRICS
    assert T.gpu_during(pd.DataFrame(), {}).attrs["why"] == T.NO_GPU


T0_NS = 1_800_000_000_000_000_000


def test_gpu_utilization_during_tasks_is_time_weighted():
    # issue 23 item 6: wake samples at task starts put most samples where short tasks start
    times, util = short_tasks.samples()
    frame = pd.DataFrame(
        {"time": (T0_NS + times * 1e9).astype("int64"), "job": "1", "dag": "1", "index": "0", "utilization_gpu": util}
    )
    row = T.gpu_during(T._timed(frame), {1: 1}).iloc[0]
    assert util.mean() > 30 and row["mean_utilization_gpu"] == pytest.approx(short_tasks.TRUTH, rel=1e-4)
    assert row["samples"] == len(util) and row["max_utilization_gpu"] == 100


# --- per task prefix: GPU readings during the tasks (task_points.PREFIX_TASKS, by hand) ---------
PREFIX = [  # job, prefix, tasks, gpu_s, utilization, sm_active, mean / max memory delta (MiB)
    [1, "mm", 2, 0.45, 50.0, 40.0, 250.0, 500.0],  # (0.5*50 + 100 + 100 + 0 + 0) / 4.5 windows
    [1, "tiny", 1, 0.005, 20.0, 10.0, 0.0, 0.0],  # 5 ms inside one window: that window's value
    [1, "late", 1, 0.0, None, None, None, None],  # after the last sample: nothing measured
    [2, "hold", 1, 0.2, 5.0, 2.5, 1000.0, 1000.0],  # B's task on A's GPU: the device's readings, B's memory
    [2, "mm", 1, 0.1, 30.0, 25.0, 0.0, 0.0],  # C's own GPU is GPU-c, not its index 1
]


@pytest.fixture(scope="module")
def prefix_stores(influxd, tmp_path_factory):
    pytest.importorskip("influxdb_client")
    points = P.prefix_gpu_points()
    database = influxd.create_database("prefix_gpu")
    P.write_influxd(influxd, database, points=points)
    spool = P.write_spool(tmp_path_factory.mktemp("prefix"), folders={"agent": points})
    canned = (("buckets()", "buckets"), ('distinct(column: "job")', "job"))  # jobs 1, 2
    fake = fake_flux(points, ("task", "gpu"), canned)
    out = {
        "influxql": query.connect(influxd.url, database=database),
        "spool": query.connect(spool),
        "flux": query.connect(fake.url, database="dask_metrics", language="flux", org="o", token="t"),
    }
    yield out
    for db in out.values():
        db.close()
    fake.stop()


def _rows(frame: pd.DataFrame, columns) -> list:
    return frame[columns].astype(object).where(frame[columns].notna(), None).values.tolist()


@pytest.mark.parametrize("kind", ["influxql", "spool", "flux"])
def test_gpu_per_prefix_weights_each_sample_by_its_window(prefix_stores, kind):
    db = prefix_stores[kind]
    frame = query.gpu_per_prefix(db)
    assert list(frame.columns) == [
        "job", "prefix", "tasks", "gpu_s", "mean_utilization_gpu", "mean_sm_active",
        "mean_device_utilization_gpu", "mean_device_sm_active", "mean_memory_delta", "max_memory_delta",
    ]  # fmt: skip
    # no worker_gpu_share written: no GPU was shared, so each job's own figures are the device's
    own, device = ["mean_utilization_gpu", "mean_sm_active"], ["mean_device_utilization_gpu", "mean_device_sm_active"]
    assert _rows(frame, own) == _rows(frame, device)
    got = _rows(frame, [c for c in frame.columns if c not in device])
    assert [row[:3] for row in got] == [row[:3] for row in PREFIX]
    for row, want in zip(got, PREFIX):
        # task starts are float Unix seconds: exact to ~0.2 us
        assert row[3:] == [None if w is None else pytest.approx(w, rel=1e-4, abs=1e-6) for w in want[3:]], row
    per_dag = query.gpu_per_prefix(db, per_dag=True)
    assert _rows(per_dag, ["job", "dag", "prefix"]) == [
        [1, 1, "mm"],
        [1, 1, "tiny"],
        [1, 3, "late"],
        [2, 2, "hold"],
        [2, 2, "mm"],
    ]
    assert query.gpu_per_prefix(db, job=2)["prefix"].tolist() == ["hold", "mm"]


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_gpu_per_prefix_on_the_task_points(stores, kind):
    frame = query.gpu_per_prefix(stores[kind])
    assert "mean_sm_active" not in frame.columns, "GPM columns only where collected"
    # job 1's matmul tasks [6+k, 11+k] (steps) start while their worker idles: 14 of their 20 windows at 80 %
    assert _rows(frame, ["job", "prefix", "tasks", "mean_utilization_gpu", "mean_memory_delta"]) == [
        [1, "matmul", 4, pytest.approx(56.0), None],
        [1, "load", 6, pytest.approx(80.0), None],
        [2, "matmul", 10, pytest.approx(40.0), None],
        [2, "sum", 2, pytest.approx(40.0), None],
    ]
    assert frame["gpu_s"].tolist() == pytest.approx([2.0, 0.6, 2.0, 0.1], abs=1e-6)  # start: float seconds


def test_gpu_per_prefix_says_why_it_is_empty():
    tasks = pd.DataFrame({"time": [2e9], "worker": "w", "job": 1, "dag": 1, "prefix": "a", "start": [1.0]})
    gpu = pd.DataFrame({"time": [1e9, 2e9], "worker": "v", "index": "0", "uuid": "GPU-1", "utilization_gpu": 5.0})
    assert T.prefix_gpu(tasks.iloc[:0], gpu).attrs["why"] == T.NO_TASK_STREAM
    assert T.prefix_gpu(tasks, gpu.iloc[:0]).attrs["why"] == T.NO_GPU_SAMPLES
    assert T.prefix_gpu(tasks, gpu.assign(utilization_gpu=None)).attrs["why"] == T.NO_GPU_SAMPLES
    why = T.prefix_gpu(tasks, gpu).attrs["why"]
    assert "['w'] used no GPU" in why
    assert T.prefix_gpu(tasks, gpu.assign(worker="w"))["mean_utilization_gpu"].tolist() == [5.0]
    unknown = T.prefix_gpu(tasks.assign(start=None), gpu.assign(worker="w", worker_memory_used=1.0))
    assert unknown[["tasks", "gpu_s"]].values.tolist() == [[1, 0.0]], "no start: nothing measured"
    assert unknown[["mean_utilization_gpu", "mean_memory_delta"]].isna().all(axis=None)


def test_gpu_per_prefix_is_vectorised():
    # issue 25: ~20,000 tasks and 50,000 samples (8 GPUs, 10 ms steps)
    rng = np.random.default_rng(0)
    n, gpus = 50_000, 8
    times = (T0_NS + np.sort(rng.uniform(0, 62.5e9, n))).astype("int64")
    gpu = pd.DataFrame(
        {
            "time": times,
            "worker": [f"w{i}" for i in rng.integers(0, gpus, n)],
            "utilization_gpu": rng.uniform(0, 100, n),
            "sm_active": rng.uniform(0, 100, n),
            "worker_memory_used": rng.uniform(0, 1000, n),
        }
    ).assign(index="0")
    gpu["uuid"] = "GPU-" + gpu["worker"]
    ends = T0_NS + rng.uniform(1e9, 62e9, 20_000)
    tasks = pd.DataFrame(
        {
            "time": ends.astype("int64"),
            "worker": [f"w{i}" for i in rng.integers(0, gpus, 20_000)],
            "job": rng.integers(1, 4, 20_000),
            "dag": 1,
            "prefix": [f"p{i}" for i in rng.integers(0, 50, 20_000)],
            "start": ends / 1e9 - rng.uniform(0.001, 0.5, 20_000),
        }
    )
    import time

    began = time.perf_counter()
    out = T.prefix_gpu(tasks, gpu)
    took = time.perf_counter() - began
    assert len(out) == 150 and out["mean_utilization_gpu"].between(30, 70).all()
    assert took < 5, f"{took:.2f} s"
