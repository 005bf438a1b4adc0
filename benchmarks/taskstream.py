"""Task stream cost: a 100,000-task graph with the task stream off, on, and on with fine metrics.

A LocalCluster of 2 worker processes x 2 threads runs one graph of 100,000
tiny tasks (``inc``, summed in groups of 100, then once more: 101,001 tasks)
with the monitor on at 200 ms in every variant (UDP into a loopback socket a
separate process drains and counts; no GPU source), alternated, ``rounds``
times on one cluster. Baseline: the same monitor without ``task-stream`` and
``fine-metrics``. Reported per variant: wall time (ratio to the baseline), the
worker processes' CPU per task (user + system seconds / tasks), and the task
points that arrived per second of the run (bounded by the workload's own task
rate). Then what one thread can write: 100,000 finished-task records turned
into task lines (``TaskStream.lines``, as the link's thread beside the agent) and
sent through the UDP sink, points/s of thread CPU. Informational: no target.

Run: ``.venv/bin/python -m benchmarks.taskstream [--quick]`` (quick: 10,000 tasks, one round).
"""

from __future__ import annotations

import time

from benchmarks import common, receivers
from benchmarks.workload import _shutdown

NAME = "taskstream"
GROUP = 100
BASE = ["tasks", "host-cpu", "host-mem", "worker-cpu", "worker-mem"]
VARIANTS = {
    "task-stream off (baseline)": BASE,
    "task-stream on": BASE + ["task-stream"],
    "task-stream + fine-metrics on": BASE + ["task-stream", "fine-metrics"],
}


def inc(x):
    return x + 1


def graph(n: int) -> tuple[dict, str]:
    """``n`` inc tasks, summed in groups of ``GROUP``, then summed once: ``n + n / GROUP + 1`` tasks."""
    dsk = {("inc", i): (inc, i) for i in range(n)}
    groups = [("sum", j) for j in range(0, n, GROUP)]
    dsk.update({("sum", j): (sum, [("inc", i) for i in range(j, min(n, j + GROUP))]) for _, j in groups})
    dsk["total"] = (sum, groups)
    return dsk, "total"


def one_run(client, n: int, tracking: list) -> dict:
    from dask_influx_metrics import Monitor

    with receivers.Drain(keep=(b"task,", b"state=")) as rx:
        m = Monitor(client, sink="udp", telegraf_address="%s:%d" % tuple(rx.address), gpu_source="none")
        m.attach(polling_interval=200, tracking=tracking)
        m.start()
        try:
            dsk, key = graph(n)
            cpu0 = common.cluster_cpu_seconds(client)
            t0 = time.perf_counter()
            assert client.get(dsk, key) == n * (n + 1) // 2
            seconds = time.perf_counter() - t0
            cpu = common.cluster_cpu_seconds(client) - cpu0
        finally:
            _shutdown(m, quiet=False)
        got = rx.counts()
    return {"seconds": seconds, "cpu": cpu, "tasks": len(dsk), "task_points": len(got["times"]), "lines": got["lines"]}


def writer_rate(n: int) -> tuple[float, int]:
    """(task points/s of thread CPU, bytes per point): ``n`` records -> lines (the task stream writes them itself,
    as on the link's thread beside the agent) -> UDP."""
    from dask_influx_metrics.schema import TRACKING
    from dask_influx_metrics.worker.taskstream import TaskStream

    stream = TaskStream(frozenset(TRACKING["task-stream"]), common.TAGS)
    compute = {"action": "compute", "start": 1.7e9, "stop": 1.7e9 + 0.01}
    for i in range(n):
        stream.ended.append((("inc", i), 1, 3, ("memory", "inc", (compute,), 28), 1.7e9))
    with receivers.Drain() as rx:
        from dask_influx_metrics.sinks.udp import UdpSink

        sink = UdpSink(tuple(rx.address))
        t0 = time.thread_time()
        lines = stream.lines(now_ns=0)
        sink.send(lines)
        seconds = time.thread_time() - t0
        sink.close()
    return n / seconds, sum(map(len, lines)) // n


def run(quick: bool = False) -> list[dict]:
    from distributed import Client, LocalCluster

    rounds, n = (1, 10_000) if quick else (2, 100_000)
    with (
        LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        one_run(client, 2000, VARIANTS["task-stream on"])  # warm-up: imports, plugin pickles
        runs = common.alternate({v: (lambda t=t: one_run(client, n, t)) for v, t in VARIANTS.items()}, rounds)
    base = runs[next(iter(VARIANTS))]
    base_wall = common.median([r["seconds"] for r in base])
    base_cpu = common.median([r["cpu"] / r["tasks"] * 1e6 for r in base])
    rows = []
    for variant, got in runs.items():
        wall = common.median([r["seconds"] for r in got])
        cpu = common.median([r["cpu"] / r["tasks"] * 1e6 for r in got])
        rate = common.median([r["task_points"] / r["seconds"] for r in got])
        tasks = got[0]["tasks"]
        notes = (
            f"{tasks:,} tasks, 2 workers x 2 threads, monitor @200 ms (UDP); median of {rounds}; task points "
            f"arrived {', '.join(str(r['task_points']) for r in got)}; lines {', '.join(str(r['lines']) for r in got)}"
            f"; runs {', '.join('%.1f' % r['seconds'] for r in got)} s"
        )
        rows += [
            common.row(
                NAME, f"wall time, {variant}", wall, "s", baseline=base_wall, notes=notes, details={"runs": got}
            ),
            common.row(NAME, f"worker CPU per task, {variant}", cpu, "us", baseline=base_cpu),
            common.row(NAME, f"task points written per second, {variant}", rate, "points/s"),
        ]
    rate, size = writer_rate(n)
    rows.append(
        common.row(
            NAME,
            "task lines written (TaskStream.lines) + sent (UDP) per second of one thread's CPU",
            rate,
            "points/s",
            notes=f"{n:,} records in one tick; {size} bytes per line",
        )
    )
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
