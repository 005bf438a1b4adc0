"""Demo: monitor a small multi-job workload on a LocalCluster and print what landed.

Run ``python -m dask_influx_metrics.demo`` (the README's first command does it
with a local influxd). With ``--influxdb-url`` reachable, samples go over UDP
to ``--telegraf-address`` (influxd's own UDP listener stands in for Telegraf)
and are read back with InfluxQL; otherwise they go to the local spool and are
read back from disk. Simulated GPUs stand in for NVML when there is no GPU.
"""

from __future__ import annotations

import argparse
import threading

import requests


def _busy(x, seconds=0.2):
    threading.Event().wait(seconds)  # stands in for a GPU kernel
    return x


def _workload(client, n):
    import dask.array as da

    x = da.random.random((2000, 2000), chunks=(500, 500))
    (x @ x.T).mean().compute()
    client.gather(client.map(_busy, range(n), pure=False))


def _reachable(url: str) -> bool:
    try:
        return requests.get(f"{url}/ping", timeout=2).status_code == 204
    except requests.RequestException:
        return False


def _count_points(url, database, run) -> int:
    q = f"SELECT count(utilization_gpu) FROM gpu WHERE run='{run}'"
    r = requests.get(f"{url}/query", params={"db": database, "q": q}, timeout=30)
    r.raise_for_status()
    series = r.json()["results"][0].get("series", [])
    return int(series[0]["values"][0][1]) if series else 0


def _wait_until_landed(count, timeout=15.0) -> None:
    """UDP points reach influxd after its batch timeout: wait until the count stops growing."""
    import time

    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        n = count()
        if n and n == last:
            return
        last = n
        threading.Event().wait(1.0)


def report(db, out_dir) -> str:
    """Jobs, DAGs, peak GPU memory per job, utilization, then CSVs, plots and the HTML report under ``out_dir``."""
    import os

    import pandas as pd

    from .. import query

    dags = db.dags()
    session = dags["session"].iloc[0] if len(dags) else "-"
    parts = [
        f"workers: {db.worker_map()}",
        "",
        f"DAGs of session {session}:",
        dags.drop(columns="session").to_string(index=False),
        "",
    ]
    peaks = query.peaks(db, "total-mem", per_job=True)
    table = peaks.assign(peak_MiB=peaks["peak"] / 2**20).pivot_table(
        index=["worker_index", "job"], columns="device", values="peak_MiB"
    )
    table.columns = [f"GPU {d} peak MiB" for d in table.columns]
    parts += ["Peak GPU memory per worker and job (server-side MAX ... GROUP BY):", table.round(1).to_string(), ""]
    summary = query.summary(db, per_job=True)
    cols = [
        "worker_index",
        "job",
        "resource",
        "samples",
        "mean",
        "max",
        "above_40",
        "device_hours",
        "unused_device_hours",
    ]
    with pd.option_context("display.float_format", "{:.3g}".format):
        parts += [
            "Utilization (mean/max %, share of samples above 40%, device-hours):",
            summary[cols].to_string(index=False),
            "",
        ]
    paths = query.to_csv(db, os.path.join(out_dir, "csv"))
    parts.append(f"CSV: {len(paths)} files in {os.path.join(out_dir, 'csv')}")
    try:
        from ..client import visualize as vis

        first, last = db.jobs()[0], db.jobs()[-1]
        lines = vis.lines(paths[0], first, ["compute-util", "mem-util"], save=os.path.join(out_dir, "lines.png"))
        boxes = vis.boxes(
            paths[0], last, ["compute-util", "total-mem"], freq=5, save=os.path.join(out_dir, "boxes.png")
        )
        del lines, boxes
        parts.append(
            f"plots: {os.path.join(out_dir, 'lines.png')} (job {first}), "
            f"{os.path.join(out_dir, 'boxes.png')} (job {last})"
        )
    except ImportError as e:
        parts.append(f"plots skipped: {e}")
    try:
        parts.append(f"report: {query.report(db, os.path.join(out_dir, 'gpu-report.html'))}")
    except ImportError as e:
        parts.append(f"report skipped: {e}")
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--influxdb-url", default="http://127.0.0.1:8086", help="InfluxDB to write to and read from")
    ap.add_argument("--database", default="dask_metrics", help="database the UDP listener writes to")
    ap.add_argument("--telegraf-address", default="127.0.0.1:8089", help="UDP line-protocol listener (host:port)")
    ap.add_argument("--spool", default=None, help="spool directory when InfluxDB is not reachable")
    ap.add_argument(
        "--local-influxd",
        action="store_true",
        help="start a private influxd on free loopback ports for the demo (needs the influxd binary)",
    )
    ap.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    ap.add_argument("--gpus", type=int, default=2, help="simulated GPUs per worker")
    ap.add_argument("--out", default="out/demo", help="folder for the CSV files and plots")
    args = ap.parse_args(argv)

    server = None
    if args.local_influxd:
        from . import localinflux

        if localinflux.available():
            server = localinflux.start()
            args.influxdb_url = server.url
            args.telegraf_address = "%s:%d" % server.udp_address
            print(f"started influxd: HTTP {server.url}, UDP listener {args.telegraf_address}")
        else:
            print(f"no influxd binary at {localinflux.INFLUXD}; the demo will spool to disk")
    try:
        return _run(args)
    finally:
        if server is not None:
            server.stop()


def _run(args) -> int:
    import uuid

    from distributed import Client, LocalCluster

    from .. import Monitor

    run = uuid.uuid4().hex[:8]
    online = _reachable(args.influxdb_url)
    sink = (
        dict(sink="udp", telegraf_address=args.telegraf_address)
        if online
        else dict(sink="spool", spool_directory=args.spool)
    )
    print(f"run {run}: {'UDP -> ' + args.telegraf_address if online else 'InfluxDB not reachable; spooling to disk'}")
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=2, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        monitor = Monitor(
            client,
            gpu_source="simulated",
            gpu_count=args.gpus,
            tags={"run": run},
            influxdb_url=args.influxdb_url,
            database=args.database,
            **sink,
        )
        monitor.attach(polling_interval=100, job_type="manual")
        session = monitor.start()
        for job in range(3):
            n = 8 * (job + 1)
            monitor.new_job(label=f"matmul + {n} busy tasks")  # the DAGs' label: which run is which
            _workload(client, n)
        monitor.stop()
        jobs = monitor.jobs()
        print(f"session {session['id']}: {len(jobs['jobs'])} jobs, {len(jobs['dags'])} DAGs")
        if online:
            _wait_until_landed(lambda: _count_points(args.influxdb_url, args.database, run))
            db = monitor.query(source=args.influxdb_url, database=args.database)
            print(f"reading back with InfluxQL from {args.influxdb_url}")
        else:
            db = monitor.query()
            print(f"reading back from the spool {db.backend.path}")
    print(report(db, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
