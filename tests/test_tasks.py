"""Tasks, activity and GPU use during tasks (client/tasks.py), from a real influxd (InfluxQL), a
spool written by the spool sink, and the Flux backend (a fake 2.x answering in annotated CSV), on
contract-shaped points (tests/task_points.py); ``dag`` as a tag and as a field."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import task_points as P

from dask_influx_metrics import query
from dask_influx_metrics.client import tasks as T
from dask_influx_metrics.client.query import flux as F

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
    frame = db.tasks()
    assert list(frame.columns) == [c for c in T.TASKS if c != "dag"]
    got = frame[["job", "prefix", "tasks", "erred", "total_s", "max_s"]].values.tolist()
    assert [row[:4] for row in got] == [row[:4] for row in TASKS]
    assert [v for row in got for v in row[4:]] == pytest.approx([v for row in TASKS for v in row[4:]])
    assert frame["compute_s"].sum() == pytest.approx(0.75 * frame["total_s"].sum())
    assert frame["nbytes"].tolist() == [400, 600, 1000, 0]
    per_dag = db.tasks(per_dag=True)
    assert per_dag[["job", "dag", "prefix", "tasks"]].values.tolist() == [
        [1, 2, "matmul", 4],
        [1, 1, "load", 6],
        [2, 3, "matmul", 10],
        [2, 3, "sum", 2],
    ]
    assert db.tasks(job=2)["prefix"].tolist() == ["matmul", "sum"]
    stream = db.task_stream(job=1)
    assert len(stream) == 10 and set(stream["dag"]) == {1, 2} and stream["key"].str.contains("-abc").all()
    with pytest.raises(ValueError, match=r"no job 7; jobs: \[1, 2\]"):
        db.tasks(job=7)


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_activity_breakdown(stores, kind):
    frame = stores[kind].activity()
    assert list(frame.columns) == T.ACTIVITY
    got = frame.values.tolist()
    assert [row[:4] for row in got] == [row[:4] for row in ACTIVITY]
    assert [row[4] for row in got] == pytest.approx([row[4] for row in ACTIVITY])
    assert stores[kind].activity(job=2)["prefix"].tolist() == ["matmul", "sum"]


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_gpu_utilization_during_tasks(stores, kind):
    frame = stores[kind].gpu_during_tasks()
    assert list(frame.columns) == T.GPU
    rows = frame[["job", "dag", "samples", "mean_utilization_gpu"]].astype(object).where(frame.notna(), None)
    assert rows.values.tolist() == [
        [1, None, 40, 80.0],
        [1, 1, 20, 80.0],
        [1, 2, 20, 80.0],
        [2, None, 40, 40.0],
        [2, 3, 40, 40.0],
    ]
    assert stores[kind].gpu_during_tasks(job=2)["samples"].tolist() == [40, 40]


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
        assert db.tasks().empty and "tracking `task-stream` is off" in db.tasks().attrs["why"]
        assert db.activity().empty and "tracking `fine-metrics` is off" in db.activity().attrs["why"]
        assert len(db.gpu_during_tasks()) == 5


# --- Flux: the same answers through influxdb-client and a fake InfluxDB 2.x -----------------
def test_flux_points_query_passes_the_flux_language_server():
    fluxcheck = pytest.importorskip("fluxcheck")
    sources = {
        m: F.flux_points_query("b", m, cols, {"run": "x"}, start_ns=1, stop_ns=2)
        for m, cols in (("task", T.TASK_COLUMNS), ("activity", T.ACTIVITY_COLUMNS))
    }
    assert fluxcheck.flux_diagnostics(sources) == {"task": [], "activity": []}


def test_flux_backend_reads_tasks_and_activity():
    pytest.importorskip("influxdb_client")
    from fake_influx2 import ANSWERS, FakeInflux

    points = P.all_points(dag_field=True)

    def answer(flux):
        if "buckets()" in flux:
            return 200, ANSWERS["buckets"]
        for m in ("task", "activity"):
            if f'r._measurement == "{m}"' in flux:
                return 200, P.flux_answer([p for p in points if p.measurement == m])
        return 200, "\r\n"

    fake = FakeInflux()
    fake.answer = answer
    try:
        with query.connect(fake.url, database="dask_metrics", language="flux", org="o", token="t") as db:
            tasks = db.tasks()
            assert tasks[["job", "prefix", "tasks", "erred"]].values.tolist() == [r[:4] for r in TASKS]
            assert tasks["total_s"].tolist() == pytest.approx([r[4] for r in TASKS])
            activity = db.activity()
            assert [r[:4] for r in activity.values.tolist()] == [r[:4] for r in ACTIVITY]
            assert db.task_stream()["time"].is_monotonic_increasing
    finally:
        fake.stop()


def test_summaries_of_no_points_are_empty_with_a_reason():
    assert T.summarize_tasks(pd.DataFrame()).attrs["why"] == T.NO_TASK_STREAM
    assert T.summarize_activity(pd.DataFrame()).attrs["why"] == T.NO_FINE_METRICS
    assert T.gpu_during(pd.DataFrame(), {}).attrs["why"] == T.NO_GPU


T0_NS = 1_800_000_000_000_000_000


def test_gpu_utilization_during_tasks_is_time_weighted():
    # issue 23 item 6: wake samples at task starts put most samples where short tasks start
    ticks = np.arange(200) * 0.1
    starts = np.arange(1, 20) + 0.03
    times = np.concatenate([ticks, (starts[:, None] + np.arange(5) * 0.002).ravel(), starts + 0.01])
    util = np.concatenate([np.zeros(200), np.full(19 * 5, 100.0), np.zeros(19)])
    frame = pd.DataFrame(
        {"time": (T0_NS + times * 1e9).astype("int64"), "job": "1", "dag": "1", "index": "0", "utilization_gpu": util}
    )
    row = T.gpu_during(T._timed(frame), {1: 1}).iloc[0]
    assert util.mean() > 30 and row["mean_utilization_gpu"] == pytest.approx(0.95, rel=1e-4)  # 19 x 10 ms busy in 20 s
    assert row["samples"] == len(util) and row["max_utilization_gpu"] == 100
