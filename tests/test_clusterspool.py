"""The spool read through the cluster: real `dask scheduler` / `dask worker` processes."""

import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest
from distributed import Client

from click.testing import CliRunner

from dask_influx_metrics import Monitor
from dask_influx_metrics.client.cli import cli
from dask_influx_metrics.client import sources

BIN = os.path.dirname(sys.executable)


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def processes(tmp_path):
    """A `dask scheduler` and two `dask worker` processes spooling under their own spool.directory."""
    spool = tmp_path / "workers-spool"
    env = {**os.environ, "DASK_INFLUX_METRICS__SPOOL__DIRECTORY": str(spool)}
    env.pop("DASK_INFLUX_METRICS__TELEGRAF__ADDRESS", None)
    env.pop("DASK_INFLUX_METRICS__INFLUXDB__URL", None)
    file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([os.path.join(BIN, "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(file)], env=env, stderr=subprocess.DEVNULL)]
    try:
        address = _wait_for(lambda: file.exists() and json.loads(file.read_text() or "{}").get("address"), 60,
                            "the scheduler")
        for _ in range(2):
            procs.append(subprocess.Popen([os.path.join(BIN, "dask"), "worker", address, "--nthreads", "2",
                                           "--no-dashboard", "--host", "127.0.0.1"], env=env,
                                          stderr=subprocess.DEVNULL))
        with Client(address) as client:
            client.wait_for_workers(2, timeout=60)
            yield client, str(spool)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(30)


def test_spool_through_the_cluster_equals_the_folder(processes, tmp_path):
    client, spool = processes
    monitor = Monitor(client, gpu_source="simulated", gpu_count=2)
    monitor.attach(polling_interval=50)
    started = monitor.start()
    workers = set(client.scheduler_info()["workers"])
    assert all(started["destinations"][w]["spool"].startswith(spool) for w in workers)
    client.gather(client.map(time.sleep, [0.05] * 40, pure=False))  # a builtin: the workers cannot import tests
    monitor.stop()
    folder = os.path.join(spool, started["id"])
    direct = monitor.to_csv(tmp_path / "direct", source=folder)
    through = monitor.to_csv(tmp_path / "through", source="cluster")
    assert [os.path.basename(p) for p in direct] == [os.path.basename(p) for p in through]
    for a, b in zip(direct, through):
        pd.testing.assert_frame_equal(pd.read_csv(a), pd.read_csv(b))
    assert monitor.get_peaks("compute-util", source="cluster") == monitor.get_peaks("compute-util", source=folder)
    assert monitor.query(source=folder).dags().equals(monitor.query(source="cluster").dags())
    copy = monitor._copy
    assert copy and os.path.isdir(copy)
    for command in (["workers"], ["peaks", "compute-util"], ["dags"]):  # the CLI given the scheduler's address
        by_folder = CliRunner().invoke(cli, [*command, "--source", folder, "--format", "csv"])
        by_cluster = CliRunner().invoke(cli, [*command, "--source", client.scheduler.address, "--format", "csv"])
        assert by_folder.exit_code == 0 and by_cluster.exit_code == 0, by_cluster.output
        assert by_cluster.output == by_folder.output
    monitor.shutdown()
    assert copy and not os.path.exists(copy)  # the local copy goes with its Store


def test_a_spool_folder_not_visible_here_is_read_through_the_cluster(tmp_path):
    elsewhere = {"sinks": ["spool"], "telegraf": None, "influxdb": None, "host": "other-host",
                 "spool": str(tmp_path / "not-here" / "s1" / "tcp-10.0.0.2-4000")}
    assert sources.pick([elsewhere]) == ("cluster", None)
    os.makedirs(elsewhere["spool"])
    assert sources.pick([elsewhere]) == ("spool", None)
