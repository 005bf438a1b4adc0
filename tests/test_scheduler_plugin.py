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
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as c:
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
