"""Demo: monitor a small multi-job workload on a LocalCluster and print what landed.

Run ``python -m dask_influx_metrics.demo`` (the README's first command does it
with a local influxd). With ``--influxdb-url`` reachable, samples go over UDP
to ``--telegraf-address`` (influxd's own UDP listener stands in for Telegraf)
and are read back with InfluxQL; otherwise they go to the local spool and are
read back from disk. Simulated GPUs stand in for NVML when there is no GPU.
"""

from __future__ import annotations

import argparse
import collections
import threading

import requests

from . import lineprotocol
from .sinks.spool import read_lines


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


def _gpu_rows_from_influx(url, database, run):
    q = f"SELECT worker, job, \"index\", utilization_gpu, memory_used FROM gpu WHERE run='{run}'"
    r = requests.get(f"{url}/query", params={"db": database, "q": q}, timeout=30)
    r.raise_for_status()
    series = r.json()["results"][0].get("series", [])
    for s in series:
        for values in s["values"]:
            yield dict(zip(s["columns"], values))


def _gpu_rows_from_spool(directory):
    for line in read_lines(directory):
        p = lineprotocol.parse(line)
        if p.measurement == "gpu":
            yield {**p.tags, **p.fields}


def summarize(rows) -> str:
    """Per worker and per job: samples, mean GPU utilization, peak GPU memory."""
    table = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        for job in str(r["job"]).split(","):
            cell = table[(r["worker"], job)]
            cell[0] += 1
            cell[1] += r.get("utilization_gpu") or 0.0
            cell[2] = max(cell[2], r.get("memory_used") or 0.0)
    lines = [f"{'worker':<28} {'job':>4} {'samples':>8} {'mean util %':>12} {'peak MiB':>10}"]
    for (worker, job), (n, util, peak) in sorted(table.items()):
        lines.append(f"{worker:<28} {job:>4} {n:>8} {util / n:>12.1f} {peak:>10.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import uuid

    from distributed import Client, LocalCluster

    from . import Monitor

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--influxdb-url", default="http://127.0.0.1:8086", help="InfluxDB to write to and read from")
    ap.add_argument("--database", default="dask_metrics", help="database the UDP listener writes to")
    ap.add_argument("--telegraf-address", default="127.0.0.1:8089", help="UDP line-protocol listener (host:port)")
    ap.add_argument("--spool", default=None, help="spool directory when InfluxDB is not reachable")
    ap.add_argument("--local-influxd", action="store_true",
                    help="start a private influxd on free loopback ports for the demo (needs the influxd binary)")
    ap.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    ap.add_argument("--gpus", type=int, default=2, help="simulated GPUs per worker")
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

    from . import Monitor

    run = uuid.uuid4().hex[:8]
    online = _reachable(args.influxdb_url)
    sink = dict(sink="udp", telegraf_address=args.telegraf_address) if online else dict(sink="spool", spool_directory=args.spool)
    print(f"run {run}: {'UDP -> ' + args.telegraf_address if online else 'InfluxDB not reachable; spooling to disk'}")
    with LocalCluster(n_workers=args.workers, threads_per_worker=2, dashboard_address=None) as cluster, Client(cluster) as client:
        monitor = Monitor(client, gpu_source="simulated", gpu_count=args.gpus, tags={"run": run}, **sink)
        monitor.attach(polling_interval=100, job_type="manual")
        session = monitor.start()
        for job in range(3):
            monitor.new_job()
            _workload(client, 8 * (job + 1))
        monitor.stop()
        jobs = monitor.jobs()
    print(f"session {session['id']}: {len(jobs['jobs'])} jobs, {len(jobs['dags'])} DAGs")
    for n, dag in sorted(jobs["dags"].items()):
        print(f"  DAG {n}: job {dag['job']}, {dag['tasks']} tasks, {dag['status']}")
    if online:
        rows = _poll_rows(lambda: list(_gpu_rows_from_influx(args.influxdb_url, args.database, run)))
    else:
        import os

        from .config import Settings

        spool = Settings.resolve({"spool.directory": args.spool} if args.spool else {}).spool_directory
        rows = list(_gpu_rows_from_spool(os.path.join(spool, session["id"])))
    print(summarize(rows))
    return 0 if rows else 1


def _poll_rows(fetch, timeout=10.0):
    """UDP points reach influxd after its batch timeout: poll briefly."""
    import time

    deadline, rows = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        rows = fetch()
        if rows:
            threading.Event().wait(1.0)  # let the last batch land too
            return fetch()
        threading.Event().wait(0.2)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
