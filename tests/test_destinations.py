"""Where samples go: sink auto, destinations recorded per worker, the old dask-metrics flow, private spool."""

import os
import socket
import stat
import time

import pytest
from distributed import Client
from polling import wait_until

from dask_influx_metrics import Monitor, query
from dask_influx_metrics.config import Settings
from dask_influx_metrics.sinks import make_sink
from dask_influx_metrics.sinks.spool import spool_files


def test_auto_sink_follows_what_is_configured():
    assert Settings.resolve().sinks == ("spool",)
    assert Settings.resolve({"telegraf.address": "10.0.0.1:8094"}).sinks == ("udp",)
    assert Settings.resolve({"influxdb.url": "http://db:8086"}).sinks == ("http",)
    both = Settings.resolve({"telegraf.address": "10.0.0.1:8094", "influxdb.url": "http://db:8086"})
    assert both.sinks == ("udp",) and both.influxdb_url == "http://db:8086"
    assert Settings.resolve({"telegraf.address": "10.0.0.1:8094", "sink": "spool"}).sinks == ("spool",)  # explicit wins
    assert Settings.resolve({"sink": ["auto", "spool"], "influxdb.url": "http://db:8086"}).sinks == ("http", "spool")


def test_auto_sink_reads_the_environment(monkeypatch):
    import dask.config

    monkeypatch.setenv("DASK_INFLUX_METRICS__TELEGRAF__ADDRESS", "10.0.0.9:8094")
    dask.config.refresh()
    try:
        s = Settings.resolve()
        assert s.sinks == ("udp",) and s.telegraf_address == ("10.0.0.9", 8094)
    finally:
        monkeypatch.delenv("DASK_INFLUX_METRICS__TELEGRAF__ADDRESS")
        dask.config.refresh()


def test_unconfigured_addresses_fall_back_for_explicit_sinks():
    s = Settings.resolve({"sink": ["udp", "http"]})
    assert s.telegraf_address == ("127.0.0.1", 8094) and s.influxdb_url == "http://127.0.0.1:8086"


def test_default_spool_is_private(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    settings = Settings.resolve({"spool.flush-interval": 0.001})
    assert settings.spool_directory == str(tmp_path / f"dask-influx-metrics-{os.getuid()}")
    sink = make_sink(settings, role="w", session="s1")
    sink.send([b"m v=1i 1"])
    sink.close()
    (path,) = spool_files(settings.spool_directory)
    for folder in (settings.spool_directory, os.path.dirname(path)):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_shared_default_spool_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    settings = Settings.resolve()
    os.mkdir(settings.spool_directory, 0o755)
    os.chmod(settings.spool_directory, 0o755)
    with pytest.raises(PermissionError, match="is not a private folder of user"):
        make_sink(settings, role="w", session="s1")


def inc(x):
    return x + 1


@pytest.fixture
def private_tmp_cluster(tmp_path, monkeypatch):
    """A LocalCluster of 2 worker processes whose temporary directory (so the default spool) is under tmp_path."""
    from distributed import LocalCluster

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the scheduler runs in this process
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster:
        yield cluster


def test_old_example_flow(private_tmp_cluster, tmp_path):
    """rapids-examples dask-metrics example.py, on CPU: two graphs, clear in between; nothing configured."""
    cluster = private_tmp_cluster
    spool = tmp_path / f"dask-influx-metrics-{os.getuid()}"
    client = Client(cluster)
    monitor = Monitor(client, gpu_source="simulated")
    monitor.attach(tracking=["total-mem", "mem-util", "compute-util"], polling_interval=200)
    first = monitor.start()
    assert set(first["destinations"]) == set(cluster.scheduler_info["workers"]) | {"scheduler"}
    assert all(d["sinks"] == ["spool"] and d["spool"].startswith(str(spool)) for d in first["destinations"].values()), (
        first
    )
    client.close()

    client = Client(cluster)
    assert client.submit(inc, 1).result() == 2  # ~ms: falls between two samples
    monitor = Monitor(client)
    monitor.stop()
    assert monitor.jobs()["destinations"] == first["destinations"]
    small = monitor.to_csv(tmp_path / "small")
    monitor.clear_metrics()
    assert spool_files(spool) == []
    second = monitor.start()
    assert sum(client.gather(client.map(inc, range(200)))) == sum(range(1, 201))
    ended = monitor.stop()
    big = monitor.to_csv(tmp_path / "big")
    peaks = monitor.peak_memory()
    assert len(peaks) == 2 and all(len(p) == 1 for p in peaks)
    assert small and big
    import pandas as pd

    small_jobs = set(pd.concat([pd.read_csv(p) for p in small if "worker_" in os.path.basename(p)])["job"])
    assert 1 in small_jobs  # the short graph left a trace
    big_rows = pd.concat([pd.read_csv(p) for p in big if "worker_" in os.path.basename(p)])
    assert second["id"] != first["id"] and ended["id"] == second["id"]
    # only the second run: its samples span at most the second session (timestamps from its first sample)
    assert 0 < big_rows["timestamp"].max() <= ended["stop"] - ended["start"] + 0.5
    assert set(big_rows["job"]) <= {0, 1}
    monitor.shutdown()
    assert spool_files(spool) == []
    client.close()


@pytest.mark.parametrize("mode", ["agent", "thread"])
def test_refused_udp_is_counted_and_reachable_from_the_client(client, mode):
    import socket

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there
    monitor = Monitor(client, telegraf_address=f"127.0.0.1:{port}", gpu_source="simulated", sampler_mode=mode)
    monitor.attach(polling_interval=20, tracking=["tasks", "compute-util"])  # no task stream: one sink each
    started = monitor.start()
    try:
        assert {d["sinks"][0] for w, d in started["destinations"].items()} == {"udp"}
        assert all(d["telegraf"] == f"127.0.0.1:{port}" for d in started["destinations"].values())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            counts = monitor.delivery()
            if all(c and c[0]["refused"] >= 2 for c in counts.values()):
                break
            time.sleep(0.1)
        assert len(counts) == 2 and all(
            c[0]["kind"] == "udp" and c[0]["points_dropped"] > 0 for c in counts.values()
        ), counts
    finally:
        monitor.shutdown()


def test_attach_again_before_shutdown_leaks_no_spool_and_delivery_after_stop_says_where(private_tmp_cluster, tmp_path):
    """Issue 45 item 5: shutdown() deletes the temporary spool of sessions attached before the last attach();
    delivery() after stop() says the session stopped, and its senders' last counters are read back."""
    spool = tmp_path / f"dask-influx-metrics-{os.getuid()}"
    with Client(private_tmp_cluster) as client:
        monitor = Monitor(client, gpu_source="simulated")
        monitor.attach(polling_interval=50, tracking=["compute-util"])
        first = monitor.start()
        assert sum(client.gather(client.map(inc, range(20)))) == sum(range(1, 21))
        assert len(monitor.delivery()) == 2  # running: each worker's sink counters
        monitor.stop()
        with pytest.raises(
            RuntimeError, match=rf"session {first['id']} stopped at .*`delivery` points.*spool -> .*query\(\)\.delivery"
        ):
            monitor.delivery()
        assert {"scheduler", f"agent-{socket.gethostname()}"} <= set(monitor.query().delivery()["worker"])

        def agent_sent() -> int:  # the agent's final counters: written as it exits, just after stop() returned
            with query.connect(spool, session=first["id"]) as db:
                last = db.delivery()
            return int(last.loc[last["worker"] == f"agent-{socket.gethostname()}", "points_sent"].iloc[0])

        wait_until(lambda: agent_sent() > 0, what="the agent's final delivery counters")
        monitor.attach(polling_interval=50, tracking=["compute-util"])  # again, before shutdown()
        second = monitor.start()
        client.submit(inc, 1).result()
        monitor.stop()
        assert spool_files(spool / first["id"]) and spool_files(spool / second["id"])
        monitor.shutdown()
    assert spool_files(spool) == []
