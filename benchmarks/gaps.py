"""Sampling accuracy: gaps between consecutive samples while tasks hold the GIL.

A LocalCluster worker (1 process, 2 threads) samples at 200 ms and at 50 ms
(8 simulated GPUs, or this node's through NVML with ``--gpu-source nvml``;
UDP) while both threads run GIL-holding pure Python. The gaps are
measured from the data: a separate process receives the datagrams and takes
the timestamps of the ``gpu`` index-0 points, one per sample, so any sampler
implementation is measured the same way. Configurations, alternated on the
same cluster: every metric in the default configuration (the host's sampling
agent, a separate process: ``sampler.mode: agent``) at 200 ms and at 50 ms; the
same with the in-process sampler (``sampler_mode="thread"``), and every metric
but the host and worker-process ones in-process at 200 ms. A package without
``sampler.mode`` runs its default in-process rows only. Baseline in the same
run: every metric with the worker idle (default configuration). Target: p99 gap
<= interval + 25 ms in the default configuration.

Run: ``.venv/bin/python -m benchmarks.gaps [--quick]``.
"""

from __future__ import annotations

import time

from benchmarks import common, receivers

NAME = "gaps"
INTERVAL_MS = 200
SLACK_MS = 25


def gil_heavy(seconds: float) -> int:
    """Pure Python that holds the GIL for ``seconds``."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for i in range(10000):
            x += i * i
    return x


def no_psutil_tracking() -> list[str]:
    from dask_influx_metrics import schema

    return [
        t for t in schema.TRACKING if schema.TRACKING[t][0][0] != schema.HOST and t not in ("worker-cpu", "worker-mem")
    ]


def gap_run(client, duration: float, busy: bool = True, interval_ms: int = INTERVAL_MS, **settings) -> dict:
    """Monitor one worker for ``duration`` s (busy or idle); gaps (ms) between its samples' timestamps."""
    from dask_influx_metrics import Monitor

    with receivers.Drain(keep=(b"gpu,", b"index=0,")) as rx:
        m = Monitor(client, sink="udp", telegraf_address="%s:%d" % tuple(rx.address), **common.gpu_settings())
        m.attach(polling_interval=interval_ms, **settings)
        m.start()
        try:
            if busy:
                nthreads = sum(client.nthreads().values())
                client.gather(client.map(gil_heavy, [duration / 2] * (2 * nthreads), pure=False))
            else:
                time.sleep(duration)
            [costs] = client.run(common.in_worker_costs).values()
        finally:
            m.shutdown()  # stop sampling everywhere (flushing the sink) and detach the scheduler plugin
        times = sorted(rx.counts()["times"])
    gaps = [(b - a) / 1e6 for a, b in zip(times, times[1:])]
    return {"gaps_ms": gaps, "costs_us": [c * 1e6 for c in costs or []]}


def summary(runs: list[dict], interval_ms: int = INTERVAL_MS) -> dict:
    gaps = [g for r in runs for g in r["gaps_ms"]]
    costs = [c for r in runs for c in r["costs_us"]]
    return {
        "samples": len(gaps) + len(runs),
        "median_gap_ms": common.median(gaps),
        "p99_gap_ms": common.percentile(gaps, 99),
        "max_gap_ms": max(gaps, default=float("nan")),
        "late_ticks": sum(1 for g in gaps if g > 1.5 * interval_ms),
        "median_cpu_us_per_sample": common.median(costs) if costs else None,
    }


def _note(s: dict) -> str:
    cpu = s["median_cpu_us_per_sample"]
    return (
        f"median {s['median_gap_ms']:.0f} ms, max {s['max_gap_ms']:.0f} ms, {s['samples']} samples, "
        f"{s['late_ticks']} gaps > 1.5 intervals" + (f", in-worker CPU {cpu:.0f} us/sample" if cpu is not None else "")
    )


def run(quick: bool = False) -> list[dict]:
    from distributed import Client, LocalCluster

    skipped = common.skipped_without_nvml(NAME)
    if skipped:
        return skipped
    duration, rounds = (3.0, 1) if quick else (12.0, 2)
    idle_duration = 2.0 if quick else 8.0
    configs = {"@200 ms, all metrics, default (agent)": {}, "@50 ms, all metrics, default (agent)": {"interval_ms": 50}}
    if common.has_sampler_mode():
        thread = {"sampler_mode": "thread"}
        configs.update(
            {
                "@200 ms, all metrics, sampler_mode=thread (in-process)": thread,
                "@50 ms, all metrics, sampler_mode=thread (in-process)": {"interval_ms": 50, **thread},
                "@200 ms, without host/process reads, sampler_mode=thread": {
                    "tracking": no_psutil_tracking(),
                    **thread,
                },
            }
        )
    else:  # an older package: its default is the in-process sampler
        configs = {
            "@200 ms, all metrics (in-process)": {},
            "@50 ms, all metrics (in-process)": {"interval_ms": 50},
            "@200 ms, without host/process reads": {"tracking": no_psutil_tracking()},
        }
    with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=":0") as cluster, Client(cluster) as client:
        client.gather(client.map(gil_heavy, [0.2, 0.2], pure=False))  # warm up the worker
        idle = summary([gap_run(client, idle_duration, busy=False)])
        runs = common.alternate(
            {name: (lambda kw=kw: gap_run(client, duration, **kw)) for name, kw in configs.items()}, rounds
        )
    rows = []
    for name, results in runs.items():
        interval = configs[name].get("interval_ms", INTERVAL_MS)
        limit = interval + SLACK_MS
        s = summary(results, interval)
        first = not rows
        default = "sampler_mode=" not in name
        rows.append(
            common.row(
                NAME,
                f"p99 gap, busy, {name}",
                s["p99_gap_ms"],
                "ms",
                baseline=idle["p99_gap_ms"],
                target=f"<= {limit} ms" if default else None,
                met=s["p99_gap_ms"] <= limit if default else None,
                notes=_note(s)
                + (
                    f"; 2 threads holding the GIL, {rounds}x{duration:.0f} s per config, alternated; "
                    f"baseline = every metric @{INTERVAL_MS} ms, worker idle: {_note(idle)}"
                    if first
                    else ""
                ),
                details={"busy": s, "idle": idle} if first else s,
            )
        )
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
