"""Shared fixtures: a private InfluxDB 1.x server (``influxd``) and fresh databases."""

from __future__ import annotations

import os
import uuid

import pytest

from dask_influx_metrics.demo import localinflux as _influxd


@pytest.fixture(scope="session")
def influxd():
    """A running ``influxd`` on 127.0.0.1 (HTTP + a UDP listener into ``dask_metrics``).

    Skips when the binary is missing, unless ``CI=true``, where that fails.
    """
    if not _influxd.available():
        message = f"influxd not found at {_influxd.INFLUXD} (Debian package 'influxdb')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    server = _influxd.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dask_processes(tmp_path):
    """Start a real `dask scheduler` and two `dask worker` processes with extra environment ``env``;
    returns a connected Client. Everything is stopped at the end of the test."""
    import json
    import subprocess
    import sys
    import time

    from distributed import Client

    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    procs, clients = [], []

    def start(env: dict) -> Client:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_INFLUX_METRICS__")} | env
        file = tmp_path / f"scheduler-{len(procs)}.json"
        procs.append(
            subprocess.Popen(
                [
                    dask,
                    "scheduler",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--no-dashboard",
                    "--dashboard-address",
                    ":0",  # its HTTP server binds one even without the dashboard: never the busy 8787
                    "--scheduler-file",
                    str(file),
                ],
                env=env,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 60
        while not (file.exists() and file.read_text().strip()):
            assert time.monotonic() < deadline, "the dask scheduler did not start"
            time.sleep(0.1)
        address = json.loads(file.read_text())["address"]
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [dask, "worker", address, "--nthreads", "2", "--no-dashboard", "--host", "127.0.0.1"],
                    env=env,
                    stderr=subprocess.DEVNULL,
                )
            )
        clients.append(Client(address))
        clients[-1].wait_for_workers(2, timeout=60)
        return clients[-1]

    try:
        yield start
    finally:
        for client in clients:
            client.close()
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(30)


@pytest.fixture
def fresh_db(influxd) -> str:
    """The name of a new, empty database on the session's ``influxd``."""
    return influxd.create_database("test_" + uuid.uuid4().hex[:12])


@pytest.fixture(scope="module")
def cluster():
    """A real LocalCluster (2 worker processes x 2 threads), one per test module."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as c:
        yield c


@pytest.fixture
def client(cluster):
    from distributed import Client

    with Client(cluster) as c:
        yield c


def _slow(x, delay=0.3):
    import threading

    threading.Event().wait(delay)
    return x


@pytest.fixture(scope="session")
def monitored(influxd, tmp_path_factory):
    """Data from one real monitored LocalCluster run, in influxd and in a spool.

    Two workers (2 threads each, simulated GPUs x2), polling every 50 ms,
    ``job_type="manual"``: job 1 runs 8 slow tasks, job 2 runs 4. Samples go
    over UDP into ``dask_metrics`` (every point tagged ``run=<id>``) and, the
    same points, into a spool. Returns a namespace with ``influxd``, ``run``,
    ``spool`` (the spool root), ``session`` (``id``, ``start``, ``stop``),
    ``workers`` (sorted addresses) and ``database``.
    """
    host, port = influxd.udp_address
    return _monitored_run(influxd, tmp_path_factory, "dask_metrics", sink="udp", telegraf_address=f"{host}:{port}")


@pytest.fixture(scope="session")
def monitored_dagfield(influxd, tmp_path_factory):
    """The same run as ``monitored`` with ``dag-tag: false`` (``dag`` a field of every sample), over
    HTTP into its own database ``dask_metrics_dagfield`` (one mode per database, see README)."""
    database = influxd.create_database("dask_metrics_dagfield")
    return _monitored_run(
        influxd, tmp_path_factory, database, sink="http", influxdb_url=influxd.url, database=database, dag_tag=False
    )


@pytest.fixture(scope="module", params=["dag-tag", "dag-field"])
def monitored_both(request):
    """``monitored``, then ``monitored_dagfield``: a module that overrides ``monitored`` with this
    fixture runs its tests in both modes of the ``dag-tag`` setting."""
    return request.getfixturevalue("monitored" if request.param == "dag-tag" else "monitored_dagfield")


def _monitored_run(influxd, tmp_path_factory, into: str, sink: str, **settings):
    """One monitored run (see ``monitored``) whose samples land in database ``into``."""
    import types

    database = into

    from distributed import Client, LocalCluster

    from dask_influx_metrics import Monitor, lineparse
    from dask_influx_metrics.client.query.metricnames import natural_key
    from dask_influx_metrics.sinks.spool import read_lines

    run = uuid.uuid4().hex[:10]
    spool = tmp_path_factory.mktemp("spool")
    with (
        LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        monitor = Monitor(
            client,
            sink=[sink, "spool"],
            spool_directory=str(spool),
            gpu_source="simulated",
            gpu_count=2,
            tags={"run": run},
            **settings,
        )
        monitor.attach(polling_interval=50, job_type="manual")
        session = monitor.start()
        try:
            monitor.new_job()
            client.gather(client.map(_slow, range(8)))
            monitor.new_job()
            client.gather(client.map(_slow, range(100, 104)))
            where = f"WHERE \"run\" = '{run}'"
            influxd.wait_for(
                f"SELECT * FROM \"gpu\" {where} AND \"job\" = '2' AND \"dag\" != '0'", 1, timeout=30, db=database
            )
            influxd.wait_for(f'SELECT * FROM "host" {where}', 1, timeout=30, db=database)
            influxd.wait_for(f"SELECT * FROM \"worker\" {where} AND \"dag\" != '0'", 1, timeout=30, db=database)
            influxd.wait_for(f"SELECT * FROM \"dag\" {where} AND \"event\" = 'end'", 2, timeout=30, db=database)
            workers = sorted(client.scheduler_info()["workers"], key=natural_key)
        finally:
            stopped = monitor.stop()
        # Everything spooled must also have landed over UDP (the last samples trail the stop).
        spooled = [lineparse.parse(line) for line in read_lines(spool)]
        for measurement in ("gpu", "host", "worker", "dag"):
            n = sum(p.measurement == measurement for p in spooled)
            influxd.wait_for(f'SELECT * FROM "{measurement}" WHERE "run" = \'{run}\'', n, timeout=30, db=database)
        # What the Monitor's own analysis API answers, while its client is connected.
        answers = {
            "peaks_spool": monitor.get_peaks("compute-util"),
            "peaks_influx": monitor.get_peaks("compute-util", source=influxd.url, database=database),
            "peak_memory": monitor.peak_memory(),
            "csv": monitor.to_csv(str(tmp_path_factory.mktemp("csv")), metrics=["compute-util", "mem-util"]),
            "report": monitor.report(str(tmp_path_factory.mktemp("report") / "gpu-report.html")),
        }
        # query()'s Store: one per session and source, reused by get_peaks/peak_memory/to_csv.
        store = monitor.query()
        monitor.peak_memory()
        reused = monitor.query() is store and not store.closed
        other = monitor.query(source=influxd.url, database=database)
        monitor.shutdown()
        answers["store"] = {
            "reused": reused,
            "other_source_closes_it": store.closed and other is not store,
            "shutdown_closes": other.closed,
        }
    return types.SimpleNamespace(
        influxd=influxd,
        run=run,
        spool=str(spool),
        session=stopped or session,
        workers=workers,
        answers=answers,
        database=database,
        dag_tag=settings.get("dag_tag", True),
    )
