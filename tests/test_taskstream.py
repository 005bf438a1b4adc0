"""Task stream and fine performance metrics per job, end to end: a real LocalCluster whose
workers spill to disk, two concurrent clients, the real influxd (HTTP sink)."""

from __future__ import annotations

import pathlib
import threading
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest
from distributed import Client, Event, LocalCluster, get_task_stream, wait

from dask_influx_metrics import Monitor

POLL_MS = 100


def block(i, mb=6, seconds=0.03):
    threading.Event().wait(seconds)  # a task that takes a while, then a result worth spilling
    return np.full(mb * 2**17, float(i))


def total(x):
    return float(x.sum())


def fail(x):
    raise ValueError("this task fails on purpose")


def started_then_slow(name):
    Event(name).set()
    threading.Event().wait(0.5)
    return 1


def _execute_seconds(dask_worker) -> float:
    digests = dict(dask_worker.digests_total)  # ("execute", span, prefix, activity, unit): Dask's totals
    return sum(v for k, v in digests.items() if isinstance(k, tuple) and k[0] == "execute" and k[-1] == "seconds")


def execute_seconds(cluster) -> float:
    """Dask's own total of the seconds its workers spent executing tasks, by its fine performance metrics."""
    with Client(cluster) as c:
        return sum(c.run(_execute_seconds).values())


@pytest.fixture(scope="module")
def spilling_cluster():
    """2 workers x 2 threads that spill early: 200 MiB each, spill from 10 % of it."""
    spill = {
        "distributed.worker.memory.target": 0.1,
        "distributed.worker.memory.spill": 0.15,
        "distributed.worker.memory.pause": False,
    }
    with (
        dask.config.set(spill),
        LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0", memory_limit="200MiB"
        ) as cluster,
    ):
        yield cluster


@pytest.fixture
def monitor(spilling_cluster, influxd, fresh_db):
    with Client(spilling_cluster) as client:
        m = Monitor(client, sink="http", influxdb_url=influxd.url, database=fresh_db, gpu_source="none")
        yield m
        try:
            m.stop()
        except RuntimeError:
            pass  # the test stopped it already


def spill_then_read(client, name: str) -> list:
    """24 blocks of 6 MiB (the workers spill most of them), then one sum of each (read back)."""
    blocks = client.map(block, range(24), key=[f"{name}-block-{i}" for i in range(24)])
    wait(blocks)
    return client.gather(client.map(total, blocks, key=[f"{name}-total-{i}" for i in range(24)]))


def test_every_task_lands_with_its_job_and_dag_and_activity_sums_to_thread_time(
    spilling_cluster, monitor, influxd, fresh_db, tmp_path
):
    monitor.attach(polling_interval=POLL_MS, tracking=["task-stream", "fine-metrics", "tasks"])
    before = execute_seconds(spilling_cluster)
    monitor.start()
    with Client(spilling_cluster) as a, Client(spilling_cluster) as b, get_task_stream(a) as dask_stream:
        with ThreadPoolExecutor(2) as both:  # both jobs run at once
            list(both.map(spill_then_read, (a, b), ("a", "b")))
    monitor.stop()
    ran = [t for t in dask_stream.data if any(s["action"] == "compute" for s in t["startstops"])]
    dags = monitor.jobs()["dags"]
    job_of = {("a" if d["client"] == a.id else "b"): str(d["job"]) for d in dags.values()}
    dags_of = {side: {str(n) for n, d in dags.items() if str(d["job"]) == job} for side, job in job_of.items()}
    assert sorted(job_of.values()) == ["1", "2"], dags

    q = 'SELECT "key", "duration", "disk_read", "disk_write", "start", job, dag, prefix, "state" FROM task'
    points = influxd.wait_for(q, len(ran), timeout=30, db=fresh_db)
    assert len(points) == len(ran) == 96, (len(points), len(ran))
    assert sorted(p["key"] for p in points) == sorted(t["key"] for t in ran)
    for p in points:
        side = p["key"][0]
        assert p["job"] == job_of[side] and p["dag"] in dags_of[side], p
        assert p["prefix"] == p["key"][: -len(p["key"].split("-")[-1]) - 1] and p["state"] == "memory", p
        assert 0 < p["duration"] < 30 and abs(p["time"] / 1e9 - p["start"] - p["duration"]) < 1e-3, p
    blocks = [p for p in points if "block" in p["prefix"]]
    assert all(p["duration"] >= 0.03 for p in blocks)
    disk = influxd.query('SELECT sum("disk_write") AS w, sum("disk_read") AS r FROM task', db=fresh_db)[0]
    assert disk["w"] > 0 and disk["r"] > 0, f"the workload did not spill: {disk}"

    # Per job, the activities measured on the task's thread (thread-cpu + thread-noncpu: Dask's split
    # of each task's execution) add up to the thread time of the job's tasks
    activity = influxd.wait_for(
        'SELECT sum("value") FROM activity WHERE unit = \'seconds\' GROUP BY job, activity', 1, timeout=30, db=fresh_db
    )
    for side, job in job_of.items():
        thread = sum(r["sum"] for r in activity if r["job"] == job and r["activity"].startswith("thread-"))
        durations = sum(p["duration"] for p in points if p["job"] == job)
        assert thread == pytest.approx(durations, rel=0.05), (side, thread, durations)
    # and every second Dask counted for execution is in some job's breakdown, once
    counted = execute_seconds(spilling_cluster) - before
    assert sum(r["sum"] for r in activity) == pytest.approx(counted, rel=0.01), (activity, counted)
    byte_rows = influxd.query("SELECT sum(\"value\") FROM activity WHERE unit = 'bytes' GROUP BY activity", db=fresh_db)
    assert any(r["activity"] == "disk-write" and r["sum"] > 0 for r in byte_rows), byte_rows

    # and the one-file report of this session shows both jobs, with their task prefixes
    pytest.importorskip("bokeh", reason="the report needs the [report] extra")
    html = pathlib.Path(monitor.report(tmp_path / "gpu-report.html")).read_text()
    for side, job in job_of.items():
        assert f'id="job-{job}"' in html and f"{side}-block" in html, (side, job)


def test_erred_and_cancelled_tasks_get_their_state_and_tracking_turns_the_stream_off(
    spilling_cluster, monitor, influxd, fresh_db
):
    monitor.attach(polling_interval=POLL_MS, tracking=["task-stream"])
    monitor.start()
    with Client(spilling_cluster) as c:
        with pytest.raises(ValueError):
            c.submit(fail, 1, key="fail-1").result()
        c.submit(total, np.ones(10), key="total-ok").result()
        running = c.submit(started_then_slow, "cancel-me-started", key="cancel-me-1")
        Event("cancel-me-started", client=c).wait(10)
        running.cancel()  # released while its thread runs on: it ends 'cancelled'
        got = influxd.wait_for('SELECT "key", "nbytes", "state", prefix FROM task', 3, timeout=30, db=fresh_db)
    monitor.stop()
    by_key = {p["key"]: p for p in got}
    assert by_key["fail-1"]["state"] == "error" and by_key["fail-1"]["nbytes"] is None, by_key
    assert by_key["total-ok"]["state"] == "memory" and by_key["total-ok"]["nbytes"] > 0, by_key
    assert by_key["cancel-me-1"]["state"] == "cancelled" and by_key["cancel-me-1"]["prefix"] == "cancel-me", by_key
    assert not influxd.query("SELECT * FROM activity", db=fresh_db), "fine-metrics was not tracked"

    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    monitor.start()
    with Client(spilling_cluster) as c:
        c.submit(total, np.ones(10), key="total-untracked").result()
    monitor.stop()
    influxd.wait_for("SELECT * FROM worker WHERE tasks > 0", 1, timeout=30, db=fresh_db)
    assert not influxd.query("SELECT * FROM task WHERE \"key\" = 'total-untracked'", db=fresh_db)


def test_the_task_stream_is_written_beside_the_agent(spilling_cluster, monitor, influxd, fresh_db):
    monitor.attach(polling_interval=POLL_MS, tracking=["task-stream", "fine-metrics", "tasks"], sampler_mode="agent")
    monitor.start()
    with Client(spilling_cluster) as c:
        c.gather(c.map(block, range(8), mb=1, seconds=0.3, key=[f"iso-{i}" for i in range(8)]))
    monitor.stop()
    got = influxd.wait_for("SELECT \"key\", job FROM task", 8, timeout=30, db=fresh_db)
    assert sorted(p["key"] for p in got) == [f"iso-{i}" for i in range(8)] and {p["job"] for p in got} == {"1"}
    influxd.wait_for("SELECT * FROM activity WHERE job = '1'", 1, timeout=30, db=fresh_db)
    influxd.wait_for("SELECT * FROM worker WHERE tasks > 0", 1, timeout=30, db=fresh_db)  # the sidecar samples
