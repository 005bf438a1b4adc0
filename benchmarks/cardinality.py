"""Series cardinality: how many InfluxDB series each measurement gains per 1,000 DAGs.

A LocalCluster of 2 worker processes x 2 threads samples every 50 ms (2
simulated GPUs each, every metric) into a fresh influxd over HTTP while one
client submits DAGs one after another, each 2 tasks of 60 ms (so samples
catch most DAGs running). Series are counted per measurement with ``SHOW
SERIES EXACT CARDINALITY`` after one DAG (the baseline) and after the DAGs;
the growth is scaled to 1,000 DAGs, once with ``dag-tag: true`` (the
default) and once with ``dag-tag: false``, each into a fresh database. With
``dag-tag: true`` each DAG a sample catches adds one series per worker (per
device for ``gpu``) and measurement, because ``dag`` is a tag of every sample;
with ``false`` it is a field and adds none. The scheduler's ``dag`` points keep
one series per job either way (``dag`` and ``status`` are fields).
Informational: no target.

Run: ``.venv/bin/python -m benchmarks.cardinality [--quick]``.
"""

from __future__ import annotations

import threading
import time

from benchmarks import common, receivers

NAME = "cardinality"
MEASUREMENTS = ("gpu", "host", "worker", "dag")


def slow(x, delay):
    threading.Event().wait(delay)  # a task that takes a while (simulated work)
    return x


def series(server, db: str) -> dict:
    out = {}
    for m in MEASUREMENTS:
        rows = server.query(f'SHOW SERIES EXACT CARDINALITY FROM "{m}"', db=db)
        out[m] = int(rows[0]["count"]) if rows else 0
    return out


def wait_stable(server, db: str, quiet: float = 3.0, timeout: float = 60.0) -> dict:
    """Series counts once they stopped changing for ``quiet`` s (the last writes have landed)."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        now_counts = series(server, db)
        now = time.monotonic()
        if now_counts != last:
            last, since = now_counts, now
        if now - since > quiet or now > deadline:
            return now_counts
        time.sleep(0.25)


def measure(client, server, dag_tag: bool, n_dags: int) -> tuple[dict, dict, float, int]:
    """Series per measurement after one DAG (the baseline: job 1 exists) and after ``n_dags`` more,
    the seconds they took and how many DAGs the samples caught running, in a fresh database with
    ``dag-tag: dag_tag``."""
    from dask_influx_metrics import Monitor

    db = server.create_database(f"cardinality_{'tag' if dag_tag else 'field'}")
    monitor = Monitor(
        client, sink="http", influxdb_url=server.url, database=db, gpu_source="simulated", gpu_count=2, dag_tag=dag_tag
    )
    monitor.attach(polling_interval=50)
    monitor.start()
    try:
        client.gather(client.map(slow, [-1, -2], delay=0.06, pure=False))
        idle = wait_stable(server, db)
        started = time.monotonic()
        for i in range(n_dags):
            client.gather(client.map(slow, [2 * i, 2 * i + 1], delay=0.06, pure=False))
        seconds = time.monotonic() - started
    finally:
        monitor.stop()
        monitor.shutdown()
    after = wait_stable(server, db)
    caught = (
        server.query('SELECT count("tasks") FROM "worker" WHERE "dag" != \'0\' GROUP BY "dag"', db=db)
        if dag_tag
        else server.query('SELECT DISTINCT("dag") FROM "worker"', db=db)
    )
    return idle, after, seconds, len(caught) - 1 - (0 if dag_tag else 1)  # less the first DAG (and '0')


def run(quick: bool) -> list[dict]:
    from distributed import Client, LocalCluster

    n_dags = 100 if quick else 1000
    rows = []
    with (
        receivers.influxd() as server,
        LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        for dag_tag in (True, False):
            idle, after, seconds, caught = measure(client, server, dag_tag, n_dags)
            for m in MEASUREMENTS:
                growth = (after[m] - idle[m]) * 1000 / n_dags
                rows.append(
                    common.row(
                        NAME,
                        f"{m}: new series per 1,000 DAGs, dag-tag: {str(dag_tag).lower()} "
                        "(2 workers, 2 GPUs each, 50 ms)",
                        round(growth, 1),
                        "series",
                        baseline=idle[m],
                        notes=f"{idle[m]} series after one DAG, {after[m]} after {n_dags} more in {seconds:.0f} s; "
                        f"samples caught {caught} of the {n_dags} DAGs running",
                    )
                )
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
