"""The spool read through the cluster: real `dask scheduler` / `dask worker` processes."""

import os
import time

import pandas as pd
import pytest
from click.testing import CliRunner

from dask_influx_metrics import Monitor
from dask_influx_metrics.client import destinations
from dask_influx_metrics.client.cli import cli


@pytest.fixture
def processes(dask_processes, tmp_path):
    """A `dask scheduler` and two `dask worker` processes spooling under their own spool.directory."""
    spool = tmp_path / "workers-spool"
    yield dask_processes({"DASK_INFLUX_METRICS__SPOOL__DIRECTORY": str(spool)}), str(spool)


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
    elsewhere = {
        "sinks": ["spool"],
        "telegraf": None,
        "influxdb": None,
        "host": "other-host",
        "spool": str(tmp_path / "not-here" / "s1" / "tcp-10.0.0.2-4000"),
    }
    assert destinations.pick([elsewhere]) == ("cluster", None)
    os.makedirs(elsewhere["spool"])
    assert destinations.pick([elsewhere]) == ("spool", None)


def test_resolve_says_where_to_read_as_a_value(tmp_path):
    """Issue 46: one function decides where a Monitor reads (``connect``'s arguments and options), and
    changes nothing of the caller's."""
    from dask_influx_metrics.config import Settings

    reader = Settings.resolve({"spool.directory": str(tmp_path / "reader"), "influxdb.username": "me"})
    spool = {"sinks": ["spool"], "telegraf": None, "influxdb": None, "host": "other-host"}
    spool["spool"] = str(tmp_path / "not-here" / "s1" / "agent-h")
    workers = {"tcp://w:1": spool}
    assert destinations.resolve(workers, "s1", reader) == (("cluster",), {})
    os.makedirs(spool["spool"])
    assert destinations.resolve(workers, "s1", reader) == ((str(tmp_path / "not-here" / "s1"),), {})
    named = {"url": "http://influx:8086", "database": "db", "retention_policy": None}
    udp = {"tcp://w:1": {"sinks": ["udp"], "telegraf": "t:8094", "influxdb": named, "spool": None}}
    where = destinations.resolve(udp, "s1", reader)
    assert where.args == ("http://influx:8086", "db") and where.options["username"] == "me"
    assert "undelivered" not in where.options and udp["tcp://w:1"]["influxdb"] is named
    assert named == {"url": "http://influx:8086", "database": "db", "retention_policy": None}


def test_destinations_set_only_in_the_workers_environment_are_used_and_read(dask_processes, influxd):
    """Workers configured by environment (Telegraf and InfluxDB), the client by nothing: the samples go
    over UDP and the client reads them back from the InfluxDB the workers named."""
    host, port = influxd.udp_address
    client = dask_processes(
        {"DASK_INFLUX_METRICS__TELEGRAF__ADDRESS": f"{host}:{port}", "DASK_INFLUX_METRICS__INFLUXDB__URL": influxd.url}
    )
    run = os.urandom(5).hex()
    monitor = Monitor(client, gpu_source="simulated", tags={"run": run})
    monitor.attach(polling_interval=50)
    started = monitor.start()
    workers = set(client.scheduler_info()["workers"])
    for w in workers:
        where = started["destinations"][w]
        assert where["sinks"] == ["udp"] and where["telegraf"] == f"{host}:{port}", where
        assert where["influxdb"]["url"] == influxd.url and where["spool"] is None
    client.gather(client.map(time.sleep, [0.1] * 8, pure=False))
    monitor.stop()
    influxd.wait_for(f"SELECT * FROM \"gpu\" WHERE \"run\" = '{run}' AND \"dag\" != '0'", 1, timeout=30)
    store = monitor.query()
    assert store.backend.language == "influxql" and store.backend.url == influxd.url, repr(store)
    peaks = monitor.get_peaks("compute-util", per_job=False)
    assert len(peaks) == 2 and all(p for p in peaks)
    monitor.shutdown()
