"""What the Monitor's readers say when the samples are not where they were expected (issue 24):
InfluxDB down behind the HTTP sink, UDP with nothing listening, workers without a GPU.
Real LocalCluster, real spool; the InfluxDB that is down is a closed loopback port."""

from __future__ import annotations

import os
import socket

import pytest

from dask_influx_metrics import Monitor, query

POLL_MS = 50


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(client, monitor, **attach) -> dict:
    monitor.attach(polling_interval=POLL_MS, **attach)
    session = monitor.start()
    client.gather(client.map(sum, [[1, 2]] * 8, pure=False))
    return session


def test_influxdb_down_with_the_http_sink_says_where_the_undelivered_copy_is(client, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    monitor = Monitor(
        client, gpu_source="simulated", sink="http", influxdb_url=url, http_timeout=1, spool_directory=str(tmp_path)
    )
    session = _run(client, monitor)
    monitor.stop()
    folder = str(tmp_path / session["id"])
    workers = sorted(w for w in session["destinations"] if w != "scheduler")
    try:
        with pytest.raises(query.QueryError) as e:
            monitor.get_peaks("compute-util")
        message = str(e.value)
        assert message.startswith(f"cannot reach InfluxDB at {url}: ")
        assert (
            f"The samples InfluxDB did not take are kept under {folder}/<sender>/undelivered/ (the host's "
            f"agent-<host>/ and each worker's own folder): read them with monitor.query(source={folder!r}) or "
            f"`dask-influx-metrics jobs --source {folder}`; once InfluxDB is back, write them into it with "
            f"`dask-influx-metrics replay {folder} --source <url>`"
        ) in message
        with query.connect(folder) as db:  # the session folder: every worker, not one of them
            assert db.workers() == workers
        assert monitor.query(source=folder).workers() == workers
        assert monitor.query(source="cluster").workers() == workers  # copied over Dask comms
    finally:
        monitor.shutdown()


def test_udp_with_nothing_listening_names_the_telegraf_address_not_a_default_url(client, tmp_path):
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 8086)) == 0:
            pytest.skip("something listens on the default InfluxDB port 8086 here")
    telegraf = f"127.0.0.1:{_closed_port()}"
    monitor = Monitor(client, gpu_source="simulated", sink="udp", telegraf_address=telegraf)
    _run(client, monitor)
    monitor.stop()
    try:
        with pytest.raises(query.QueryError) as e:
            monitor.get_peaks("compute-util")
        message = str(e.value)
        assert message.startswith(
            f"cannot read the samples back: the workers sent them over UDP to Telegraf at "
            f"{telegraf}, and this reader has no influxdb.url configured (the default tried: "
            "http://127.0.0.1:8086: "
        )
        assert "set influx-metrics.influxdb.url to the InfluxDB that Telegraf writes to" in message
    finally:
        monitor.shutdown()


def test_gpu_only_tracking_without_a_gpu_says_the_workers_reported_no_gpu(client, tmp_path):
    monitor = Monitor(client, gpu_source="none", spool_directory=str(tmp_path))
    _run(client, monitor, tracking=["mem-util", "compute-util"])
    monitor.stop()
    try:
        for read in (
            lambda: monitor.get_peaks("mem-util"),
            monitor.peak_memory,
            lambda: monitor.to_csv(tmp_path / "csv"),
        ):
            with pytest.raises(
                query.QueryError,
                match=r"the workers wrote no samples there, though the scheduler "
                r"recorded \d+ DAG\(s\): if only GPU metrics were tracked, the workers reported no GPU",
            ):
                read()
        assert not os.path.exists(tmp_path / "csv" / "worker_0.csv")
    finally:
        monitor.shutdown()


def test_gpu_and_host_tracking_without_a_gpu_never_exports_part_of_the_workers(client, tmp_path):
    monitor = Monitor(client, gpu_source="none", spool_directory=str(tmp_path))
    session = _run(client, monitor, tracking=["mem-util", "host-cpu"])
    monitor.stop()
    workers = sorted(w for w in session["destinations"] if w != "scheduler")
    try:
        with pytest.raises(
            ValueError,
            match=r"metric\(s\) \['mem-util'\] were not collected; the workers "
            r"reported no GPU \(NVML missing, no device visible",
        ):
            monitor.get_peaks("mem-util")
        with pytest.raises(
            query.QueryError,
            match=r"(worker\(s\) \[.*\] sampled in this session but wrote no "
            r"samples|no samples for worker\(s\) \[.*\]) .*; no CSV written",
        ) as e:
            monitor.to_csv(tmp_path / "csv")
        assert any(w in str(e.value) for w in workers)
        assert not os.path.exists(tmp_path / "csv" / "worker_0.csv")
    finally:
        monitor.shutdown()
