"""The scheduler plugin on a real LocalCluster: DAG status on cancellation, restart, session end."""

import logging
import threading
import time

import pytest
from distributed import Client, LocalCluster

from dask_influx_metrics import Monitor


def slow(x, delay=0.3):
    threading.Event().wait(delay)  # a task that takes a while (simulated work)
    return x


@pytest.fixture(scope="module")
def small_cluster():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        yield c


@pytest.fixture
def monitor(small_cluster, tmp_path):
    """A started monitor (spool, no GPU, tasks only) on a client of its own; stopped and removed after."""
    with Client(small_cluster) as client:
        m = Monitor(client, spool_directory=str(tmp_path), gpu_source="none")
        m.attach(polling_interval=100, tracking=["tasks"])
        m.start()
        yield m
        if m.jobs()["session"]:
            m.stop()
        m.shutdown()


def wait_for_status(monitor, dag, timeout=15.0):
    deadline = time.monotonic() + timeout
    while (status := monitor.jobs()["dags"].get(dag, {}).get("status")) in (None, "running"):
        assert time.monotonic() < deadline, f"DAG {dag} still {status}"
        threading.Event().wait(0.05)
    return status


def test_cancelled_futures_and_a_killed_client_end_their_dags_cancelled(small_cluster, monitor):
    client = monitor.client
    futures = client.map(slow, range(20), delay=1.0)  # DAG 1: one thread, 20 s of work
    client.cancel(futures)
    assert wait_for_status(monitor, 1) == "cancelled"
    with Client(small_cluster) as doomed:
        kept = doomed.map(slow, range(100, 120), delay=1.0)  # DAG 2
        threading.Event().wait(0.3)
    del kept
    assert wait_for_status(monitor, 2) == "cancelled"
    assert client.submit(slow, 1, 0.01).result() == 1  # DAG 3
    assert wait_for_status(monitor, 3) == "ok"


def test_restart_ends_running_dags_cancelled(monitor):
    futures = monitor.client.map(slow, range(20), delay=1.0)
    threading.Event().wait(0.3)
    monitor.client.restart()
    assert wait_for_status(monitor, 1) == "cancelled"
    del futures


def test_shutdown_after_stop_logs_no_error_on_the_scheduler(small_cluster, tmp_path, caplog):
    with Client(small_cluster) as client:
        monitor = Monitor(client, spool_directory=str(tmp_path), gpu_source="none")
        monitor.attach(polling_interval=100, tracking=["tasks"])
        monitor.start()
        monitor.stop()
        with caplog.at_level(logging.ERROR):
            monitor.shutdown()
        assert client.run_on_scheduler(lambda dask_scheduler: "influx-metrics-jobs" in dask_scheduler.plugins) is False
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_idle_processes_spool_within_the_flush_interval_and_the_scheduler_writes_its_delivery_counts(
    small_cluster, tmp_path, monkeypatch
):
    """Issue 23 items 2 and 9, delivery health: while the session still runs, the scheduler's last DAG point
    and the worker's task points reach the disk within ~flush-interval; every folder is 0700; the
    scheduler's sink writes its ``delivery`` counters (every HEALTH_INTERVAL s, and at stop)."""
    from dask_influx_metrics import lineparse
    from dask_influx_metrics.sinks import health
    from dask_influx_metrics.sinks.spool import read_lines

    monkeypatch.setattr(health, "HEALTH_INTERVAL", 0.5)  # LocalCluster: the scheduler runs in this process
    with Client(small_cluster) as client:
        m = Monitor(client, spool_directory=str(tmp_path / "spool"), gpu_source="none", flush_interval=0.5)
        m.attach(polling_interval=100, tracking=["task-stream"])
        session = m.start()["id"]
        try:
            assert client.gather(client.map(slow, range(40), delay=0.0)) == list(range(40))
            ended = time.monotonic()
            while True:
                points = [lineparse.parse(line) for line in read_lines(tmp_path / "spool")]
                ends = [p for p in points if p.measurement == "dag" and p.fields["event"] == "end"]
                tasks = [p for p in points if p.measurement == "task"]
                health = [p for p in points if p.measurement == "delivery" and p.fields["points_sent"] > 0]
                if ends and len(tasks) == 40 and health:
                    break
                assert time.monotonic() - ended < 5, f"on disk: {len(ends)} dag end, {len(tasks)} of 40 tasks"
                threading.Event().wait(0.05)
            assert m.jobs()["session"] is not None  # still running: no teardown flushed them
        finally:
            m.stop()
            m.shutdown()
    assert health[0].tags | {"host": "h"} == {"host": "h", "worker": "scheduler", "sink": "spool", "session": session}
    assert set(health[0].fields) == {"points_sent", "points_dropped", "points_refused", "points_spooled", "errors"}
    folders = [tmp_path / "spool" / session] + [p for p in (tmp_path / "spool" / session).iterdir()]
    assert len(folders) >= 3 and all(oct(f.stat().st_mode & 0o777) == "0o700" for f in folders)


def test_tasks_carry_the_one_annotation_the_data_contract_documents(small_cluster, monitor):
    """Issue 48: the job and DAG travel with each task as an annotation, documented as part of the contract."""
    import pathlib

    from dask_influx_metrics.names import ANNOTATION

    with Client(small_cluster) as client:
        future = client.submit(slow, 1, 0.0, key="annotated")
        assert future.result() == 1
        annotations = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.tasks["annotated"].annotations)
    assert list(annotations) == [ANNOTATION] and sorted(annotations[ANNOTATION]) == ["dag", "job", "session"]
    contract = (pathlib.Path(__file__).parent.parent / "docs" / "data-contract.md").read_text()
    assert f'`{ANNOTATION}` (`names.ANNOTATION`), `{{"session": <session id>, "job": <int>, "dag": <int>}}`' in contract
