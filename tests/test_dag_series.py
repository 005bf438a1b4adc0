"""Series per DAG (issue 13, item 8), counted by a real influxd after real DAGs on a LocalCluster.

The scheduler's ``dag`` points keep one series per job however many DAGs run (``dag`` and
``status`` are fields, times strictly increase); with ``dag-tag: false`` the samples keep one
series per worker (and device) too, while ``dag-tag: true`` adds series as DAGs run.
"""

from __future__ import annotations

import threading
import time

import pytest

from dask_influx_metrics import Monitor, lineparse, lineprotocol, query
from dask_influx_metrics.config import Settings
from dask_influx_metrics.sampling.sampler import Sampler
from dask_influx_metrics.schema import Point

N_DAGS = 12


def slow(x, delay):
    threading.Event().wait(delay)  # a task that takes a while (simulated work)
    return x


def series(influxd, db: str, measurement: str) -> int:
    rows = influxd.query(f'SHOW SERIES EXACT CARDINALITY FROM "{measurement}"', db=db)
    return int(rows[0]["count"]) if rows else 0


def run_dags(client, influxd, db: str, dag_tag: bool) -> None:
    """``N_DAGS`` DAGs of two 150 ms tasks, one after another."""
    monitor = Monitor(
        client, sink="http", influxdb_url=influxd.url, database=db, gpu_source="simulated", gpu_count=2, dag_tag=dag_tag
    )
    monitor.attach(polling_interval=50)
    monitor.start()
    try:
        for i in range(N_DAGS):
            client.gather(client.map(slow, [2 * i, 2 * i + 1], delay=0.15, pure=False))
        influxd.wait_for("SELECT * FROM \"dag\" WHERE \"event\" = 'end'", N_DAGS, db=db, timeout=30)
    finally:
        monitor.stop()
        monitor.shutdown()


@pytest.mark.parametrize("dag_tag", [True, False])
def test_series_count_per_dag_mode(client, influxd, fresh_db, dag_tag):
    run_dags(client, influxd, fresh_db, dag_tag)
    # dag points: one series (one host, one client = one job), every point kept, none overwritten
    assert series(influxd, fresh_db, "dag") == 1
    points = influxd.query('SELECT "dag", "status", "event" FROM "dag"', db=fresh_db)
    assert sorted((int(p["dag"]), p["event"]) for p in points) == sorted(
        (d, e) for d in range(1, N_DAGS + 1) for e in ("submit", "end")
    )
    assert len({p["time"] for p in points}) == len(points)
    caught = {p["dag"] for p in influxd.query('SELECT "dag", "tasks" FROM "worker"', db=fresh_db)} - {"0"}
    assert len(caught) >= N_DAGS // 2, caught  # the samples saw most DAGs running
    jobs = influxd.query('SHOW TAG VALUES FROM "worker" WITH KEY = "job"', db=fresh_db)
    assert {j["value"] for j in jobs} <= {"0", "1"}  # "0": idle before the first task, job stays a tag
    # 2 workers x 2 simulated GPUs, per job value; the host once per host (sampler.host-once), by one
    # writer at a time: the other worker may take over for a sample while the first one tears down
    per_worker = {"gpu": 2 * 2, "host": 1, "worker": 2}
    for m, n in per_worker.items():
        n *= len(jobs)
        if dag_tag:  # a series per DAG a sample caught, per worker (and GPU)
            assert series(influxd, fresh_db, m) > n + len(caught) // 2, m
        elif m == "host":
            assert n <= series(influxd, fresh_db, m) <= 2 * n, m
        else:
            assert series(influxd, fresh_db, m) == n, m
    with query.connect(influxd.url, database=fresh_db) as db:  # read back the same in both modes
        dags = db.dags()
        assert list(dags["dag"]) == list(range(1, N_DAGS + 1)) and set(dags["status"]) == {"ok"}
        assert set(dags["tasks"]) == {2} and (dags["duration"] > 0).all()
        table = next(iter(query.worker_tables(db, metrics=["tasks", "compute-util"]).values()))
        busy = table[table["dag"] != "0"]
        assert len(busy) and (busy["tasks"] > 0).all() and set(table["dag"]) - {"0"} <= caught
        assert query.peaks(db, "compute-util", per_job=True)["job"].tolist()


def collect(tags):
    def points(now_ns):
        return [
            Point("gpu", {**tags, "index": "0"}, {"utilization_gpu": 1.0}, now_ns),
            Point("task", {**tags, "prefix": "sum", "state": "memory"}, {"duration": 0.5}, now_ns),
        ]

    return points


def test_dag_tag_false_moves_dag_into_the_fields_of_every_sample_point():
    tags = {"host": "h", "worker": "w", "job": "1", "dag": "2,3"}
    points = Sampler(collect(tags), None, field_tags=("dag",)).sample()
    assert [p.measurement for p in points] == ["gpu", "task"]
    assert all("dag" not in p.tags and p.fields["dag"] == "2,3" and p.tags["job"] == "1" for p in points)
    line = lineprotocol.encode_many(points)[0]
    assert line.split(b" ")[0] == b"gpu,host=h,index=0,job=1,worker=w" and line.split(b" ")[1].endswith(b',dag="2,3"')
    assert all(p.tags["dag"] == "2,3" for p in Sampler(collect(tags), None).sample())


@pytest.mark.parametrize("value, expected", [(False, False), ("false", False), ("true", True), ("off", False)])
def test_dag_tag_setting(value, expected):
    assert Settings.resolve({}).dag_tag is True
    assert Settings.resolve({"dag-tag": value}).dag_tag is expected


def test_dag_tag_refuses_a_non_boolean():
    with pytest.raises(ValueError, match=r"influx-metrics.dag-tag.*true or false.*'maybe'"):
        Settings.resolve({"dag-tag": "maybe"})


def test_dag_point_times_strictly_increase_per_series():
    from dask_influx_metrics.scheduler.plugin import JobPlugin

    sent = []
    plugin = JobPlugin({"sink": "spool", "gpu.source": "none"}, worker_payload=b"")
    plugin.sink = type("Sink", (), {"send": lambda self, lines: sent.extend(lines)})()
    plugin._tags, plugin._last_ns = {"host": "h"}, 0
    now = time.time()
    for n in range(1, 4):  # three empty DAGs at one instant: six points, six times
        dag = plugin.book.submit("c", [], now=now)
        plugin._write_dag(dag, "submit")
        plugin._write_dag(dag, "end")
    points = [lineparse.parse(line) for line in sent]
    assert [p.time_ns for p in points] == list(range(points[0].time_ns, points[0].time_ns + 6))
    assert {tuple(sorted(p.tags.items())) for p in points} == {(("host", "h"), ("job", "1"))}
    assert [(p.fields["dag"], p.fields["status"]) for p in points][:2] == [("1", "ok"), ("1", "ok")]


def test_a_database_with_both_forms_reads_back_whole(influxd, fresh_db):
    """Points from before (dag and status tags; dag-tag: true) and after (fields) in one database."""
    t0, w = 1_714_564_800_000_000_000, "tcp://10.0.0.1:1"
    old, new = {"job": "1", "dag": "1", "status": "ok"}, {"dag": "2", "status": "erred"}
    points = [
        Point("dag", old, {"event": "submit", "tasks": 2, "label": "c"}, t0),
        Point("dag", old, {"event": "end", "duration": 1.0}, t0 + 10**9),
        Point(
            "dag",
            {"job": "1"},
            {**new, "status": "running", "event": "submit", "tasks": 1, "label": "c"},
            t0 + 2 * 10**9,
        ),
        Point("dag", {"job": "1"}, {**new, "event": "end", "duration": 0.5}, t0 + 3 * 10**9),
    ]
    for k, dag in enumerate(["0", "1", "1,2"]):
        tags = {"host": "h", "worker": w, "job": "1", "index": "0"}
        fields = {"utilization_gpu": 10.0 * k}
        points.append(
            Point("gpu", {**tags, "dag": dag}, fields, t0 + k)
            if k < 2
            else Point("gpu", tags, {**fields, "dag": dag}, t0 + k)
        )
    influxd.write(b"\n".join(lineprotocol.encode_many(points)), db=fresh_db)
    with query.connect(influxd.url, database=fresh_db) as db:
        dags = db.dags()
        assert list(dags["dag"]) == [1, 2] and list(dags["status"]) == ["ok", "erred"]
        assert list(dags["tasks"]) == [2, 1]
        frame = db.backend.frame("gpu", ["utilization_gpu"], w)
        assert list(frame["dag"]) == ["0", "1", "1,2"] and list(frame["utilization_gpu"]) == [0, 10, 20]
