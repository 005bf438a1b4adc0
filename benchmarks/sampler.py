"""Sampler cost and schedule accuracy.

1. Cost: CPU microseconds per sample on the sampling thread, 8 simulated GPUs,
   every built-in metric, sent through the UDP sink; split into read, encode,
   send. Baseline in the same run: the same sample with only the tasks source.
2. Gaps: a LocalCluster worker sampling at 200 ms while its threads run
   GIL-holding pure-Python tasks; the gaps between consecutive samples, with
   every metric and, side by side, without the psutil (host/process) reads.

Run: ``.venv/bin/python benchmarks/sampler.py`` (about 45 s).
"""

from __future__ import annotations

import socket
import statistics
import time

from dask_influx_metrics import lineprotocol, schema
from dask_influx_metrics.sampler import Sampler
from dask_influx_metrics.sinks.udp import UdpSink
from dask_influx_metrics.sources.activity import CachedActivity, TaskRegistry, TaskSource
from dask_influx_metrics.sources.host import HostSource
from dask_influx_metrics.sources.simulated import SimulatedGpuSource

N = 2000
TAGS = {"host": socket.gethostname(), "worker": "tcp://127.0.0.1:40000", "job": "1", "dag": "3"}


def _cpu_us(fn, n=N):
    out = []
    for _ in range(n):
        t = time.thread_time_ns()
        fn()
        out.append((time.thread_time_ns() - t) / 1000)
    return statistics.median(out)


def cost_table():
    reg = TaskRegistry(nthreads=8, managed_bytes=lambda: 3 << 30)
    for i in range(6):
        reg.started(("task", i), 1, 3)
    activity = CachedActivity(reg)
    fields = schema.fields_for(schema.TRACKING)
    gpu = SimulatedGpuSource(8, fields, activity)
    sources = [gpu, HostSource(fields), TaskSource(fields, activity)]
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    sink = UdpSink(receiver.getsockname(), max_datagram=1472)
    full = Sampler(sources, sink, lambda: TAGS, before_sample=activity.refresh)
    tasks_only = Sampler([TaskSource(fields, activity)], sink, lambda: TAGS, before_sample=activity.refresh)
    points = full.sample()
    lines = lineprotocol.encode_many(points)
    rows = {
        "read (all sources)": _cpu_us(full.sample),
        "  of which simulated GPU x8": _cpu_us(gpu.read),
        "  of which host + process": _cpu_us(sources[1].read),
        "encode": _cpu_us(lambda: lineprotocol.encode_many(points)),
        "send (UDP)": _cpu_us(lambda: sink.send(lines)),
        "total per sample": _cpu_us(full.sample_and_send),
        "baseline: tasks source only": _cpu_us(tasks_only.sample_and_send),
    }
    receiver.close()
    return rows, len(lines), sum(map(len, lines))


def _gil_heavy(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for i in range(10000):
            x += i * i
    return x


def gap_table(duration=12.0, tracking=None):
    from distributed import Client, LocalCluster

    from dask_influx_metrics import Monitor

    with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as cluster, Client(cluster) as client:
        m = Monitor(client, sink="udp", telegraf_address="127.0.0.1:9", gpu_source="simulated", gpu_count=8)
        m.attach(polling_interval=200, tracking=tracking)
        m.start()
        client.gather(client.map(_gil_heavy, [duration / 2] * 4, pure=False))
        gaps = client.run(lambda dask_worker: list(dask_worker.plugins["influx-metrics"].sampler.gaps))
        costs = client.run(lambda dask_worker: list(dask_worker.plugins["influx-metrics"].sampler.costs))
        m.stop()
    [g] = gaps.values()
    [c] = costs.values()
    g = sorted(x * 1000 for x in g)
    return {"samples": len(g) + 1, "median gap ms": statistics.median(g),
            "p99 gap ms": g[int(0.99 * (len(g) - 1))], "max gap ms": g[-1],
            "in-worker CPU us/sample (median)": statistics.median(c) * 1e6}


def main():
    rows, nlines, nbytes = cost_table()
    print(f"Sampler cost, CPU us per sample (median of {N}); {nlines} lines, {nbytes} bytes per sample")
    for k, v in rows.items():
        print(f"  {k:<32} {v:8.1f}")
    print(f"  ratio total / baseline          {rows['total per sample'] / rows['baseline: tasks source only']:8.1f}x")
    no_host = [t for t in schema.TRACKING if schema.TRACKING[t][0][0] != schema.HOST and t != "worker-cpu"
               and t != "worker-mem"]
    runs = {"all metrics": gap_table(), "without psutil (GPU + tasks)": gap_table(tracking=no_host)}
    print("\nGaps at 200 ms polling, worker threads running GIL-holding Python (2 threads, 12 s)")
    print(f"  {'':<32} " + " ".join(f"{name:>30}" for name in runs))
    for k in runs["all metrics"]:
        print(f"  {k:<32} " + " ".join(f"{r[k]:30.1f}" for r in runs.values()))


if __name__ == "__main__":
    main()
