"""Cost to the Dask workload: wall time of a fixed workload, monitor off vs on.

A LocalCluster of 2 worker processes (1 thread each) runs the same workload
(many small tasks, then a few dask.array operations) with the monitor off,
on at 200 ms and on at 50 ms in the default configuration (every metric, 8
simulated GPUs per worker, UDP to a loopback socket that a separate process
drains and counts; one sampling agent process per host samples where the package
has ``sampler.mode``), attached but not started (the scheduler plugin installed; without a
started session it tags no task and nothing samples), plus on at 200 ms with
``sampler_mode="thread"`` (the in-process sampler) for comparison, in rotation,
``rounds`` times, on the same cluster. Only the workload is timed;
attach/start and shutdown (stop + detach) happen outside the timed region.
Reported: medians per mode and their ratio to "off", the median of the
per-round ratios, the CPU seconds the worker processes (and their children, the
agent among them: the first worker of the session starts it) used, and the samples
that arrived. Target: at most 2 %
slower at 200 ms.

Second, 4,000 short pure-Python tasks (``short_tasks``), monitor off vs on at
50 ms in the default configuration, and in-process (``sampler_mode="thread"``),
alternated on the same cluster, 9 rounds: the per-task costs of monitoring
(``transition()``, the task stream's point per task, wakes). Target: at most 2 %
slower at 50 ms in the default configuration.

Third, the CPU stand-in for a launch-bound GPU loop (the <= 1 % target): ONE
task per round on a LocalCluster of ONE worker process with 1 thread (the
machine's other core stays free, as a GPU node has spare cores beside each
GPU's worker) running a tight loop of ``LAUNCHES`` calls of a tiny pure-Python
function (the "kernel launches", ~2 s in all, timed inside the task); monitor
off vs on at 50 ms in the default configuration (agent) vs on at 50 ms
``sampler_mode="thread"``, every metric, 1 simulated GPU, UDP to a drained loopback
socket; ``LAUNCH_ROUNDS`` alternated rounds. What it measures: how much the
monitor slows one busy task thread (GIL hand-offs, the worker's own sampling
thread), as the 1.040x measured on an H100 with the old in-process sampler did.
``--gpu-source nvml`` samples this node's GPUs instead of 8 simulated ones
(skipped where NVML sees none).

Run: ``.venv/bin/python -m benchmarks.workload [--quick]``.
"""

from __future__ import annotations

import logging
import time

from benchmarks import common, receivers

NAME = "workload"
TARGET = 1.02
LAUNCH_TARGET = 1.01  # the launch-bound loop at 50 ms (default configuration) vs off
LAUNCHES, LAUNCH_ROUNDS = 300_000, 11  # calls of launch() per round (~2 s); rounds
SHORT_ROUNDS = 9  # the 4,000 short tasks (issue 22: <= 1.02x at 50 ms, the default configuration)
LINES_PER_SAMPLE = 10  # 8 GPUs + host + worker


def launch(x: int) -> int:
    """One "kernel launch": a few microseconds of pure Python."""
    for i in range(200):
        x = (x * 31 + i) & 0xFFFF
    return x


def launch_loop(steps: int) -> float:
    """The task: ``steps`` launches back to back; its own wall time in seconds."""
    t0, x = time.perf_counter(), 1
    for _ in range(steps):
        x = launch(x)
    return time.perf_counter() - t0


def launch_bound(client, steps: int) -> float:
    """One task running :func:`launch_loop` on the (single) worker; the loop's wall time."""
    return client.submit(launch_loop, steps, pure=False).result()


def small_task(i: int) -> int:
    return sum(range(200)) + i


def workload(client, n_small: int, n: int, chunk: int) -> float:
    """Run the fixed workload once; return its wall time in seconds."""
    import dask.array as da

    t0 = time.perf_counter()
    client.gather(client.map(small_task, range(n_small), pure=False))
    x = da.random.RandomState(0).random_sample((n, n), chunks=(chunk, chunk))
    x = client.persist(x)
    (x + x.T).mean().compute()
    (x @ x[:, :chunk]).sum().compute()
    x.std(axis=0).sum().compute()
    del x
    return time.perf_counter() - t0


def short_tasks(client, n: int) -> float:
    """Only short pure-Python tasks, ``n`` of them, in batches of 200; wall time in seconds."""
    t0 = time.perf_counter()
    for start in range(0, n, 200):
        client.gather(client.map(small_task, range(start, min(n, start + 200)), pure=False))
    return time.perf_counter() - t0


def _shutdown(monitor, quiet: bool) -> None:
    """Stop sampling everywhere (flushing sinks) and detach the scheduler plugin.

    ``quiet``: nothing was started, so the (in-process) scheduler's error log for
    unregistering the absent worker plugin is silenced."""
    log = logging.getLogger("distributed.core")
    level = log.level
    if quiet:
        log.setLevel(logging.CRITICAL)
    try:
        monitor.shutdown()
    finally:
        log.setLevel(level)


def _monitor_parts(client) -> tuple[list, set]:
    """The monitor's own threads in the workers (pid, thread id) and its agents' pids."""
    threads = [t for ts in client.run(common.monitor_threads).values() for t in ts]
    return threads, set(client.run(common.agent_pid).values()) - {None}


def _monitor_cpu_ns(threads, agents) -> int:
    """What the monitor itself has spent (schedstat), beside the per-task hooks on a worker's event loop
    (``benchmarks.pertask``)."""
    return common.threads_cpu_ns(threads) + sum(common.process_cpu_ns(a) for a in agents)


def monitored(
    client, sizes: tuple, interval_ms=None, start: bool = True, work=workload, gpus: int = 8, **settings
) -> dict:
    """One timed workload run, with the monitor on at ``interval_ms`` (None = off).

    ``start=False``: attached only (the scheduler plugin installed, no session: no task tagged, nothing sampled)."""
    from dask_influx_metrics import Monitor

    with receivers.Drain() as rx:
        m = None
        if interval_ms is not None:
            m = Monitor(client, sink="udp", telegraf_address="%s:%d" % tuple(rx.address), **common.gpu_settings(gpus))
            m.attach(polling_interval=interval_ms, **settings)
            if start:
                m.start()
        try:
            cpu0, here0 = common.cluster_cpu_seconds(client), time.process_time()
            parts = _monitor_parts(client) if m is not None and start else None
            own0 = parts and _monitor_cpu_ns(*parts)
            seconds = work(client, *sizes)
            cpu, here = common.cluster_cpu_seconds(client) - cpu0, time.process_time() - here0
            own = parts and _monitor_cpu_ns(*parts) - own0
            costs = [c for w in client.run(common.in_worker_costs).values() for c in (w or [])]
        finally:
            if m is not None:
                _shutdown(m, quiet=not start)
        lines = rx.counts()["lines"]
    return {
        "seconds": seconds,
        "cpu": cpu,  # the worker processes and the agent
        "scheduler_cpu": here,  # this process: the (local) cluster's scheduler and the client
        "monitor_cpu": own and own / 1e9,  # the agent + the monitor's threads in the workers (None: off)
        "samples": lines / (LINES_PER_SAMPLE - 8 + gpus),
        "cost_us": common.median(costs) * 1e6 if costs else None,
    }


def _row(
    mode: str,
    on: list,
    off: list,
    rounds: int,
    target: float | None,
    what: str = "workload",
    workers: int = 2,
    note: str = "",
) -> dict:
    wall, base = [r["seconds"] for r in on], [r["seconds"] for r in off]
    med, ratio = common.median(wall), common.median(wall) / common.median(base)
    ratios = [a / b for a, b in zip(wall, base)]
    paired, interval = common.median(ratios), common.median_interval(ratios)
    spread = f" (95 % interval {interval[0]:.3f}-{interval[1]:.3f})" if interval else ""
    cpu_ratio = common.median([r["cpu"] for r in on]) / common.median([r["cpu"] for r in off])
    rate = common.median([r["samples"] / r["seconds"] / workers for r in on])
    costs = [r["cost_us"] for r in on if r["cost_us"] is not None]
    cost = (
        (
            f" at {common.median(costs):.0f} us in-worker CPU each"
            f" (= {rate * common.median(costs) / 1e4:.2f} % of a core per worker)"
        )
        if costs
        else ""
    )
    return common.row(
        NAME,
        f"{what} wall time, monitor {mode} vs off",
        med,
        "s",
        baseline=common.median(base),
        target=f"<= {target:.2f}x" if target else None,
        met=(ratio <= target) if target else None,
        notes=(
            f"{note}median of {rounds} alternated runs; per-round ratio median {paired:.3f}{spread}; CPU seconds "
            f"ratio (workers + agent) {cpu_ratio:.3f}; {rate:.1f} samples/s per worker arrived{cost}; "
            f"runs {', '.join(f'{x:.2f}' for x in wall)} s"
        ),
        details={"runs": on, "paired_ratio_median": paired, "paired_interval": interval, "worker_cpu_ratio": cpu_ratio},
    )


def array_modes() -> dict:
    """The modes of the array workload's rounds, in their running order: ``monitored`` keyword arguments."""
    modes = {
        "off": {},
        "on @200 ms": {"interval_ms": 200},
        "on @50 ms": {"interval_ms": 50},
        "attached only (no sampling)": {"interval_ms": 200, "start": False},
    }
    if common.has_sampler_mode():
        modes["on @200 ms, sampler_mode=thread"] = {"interval_ms": 200, "sampler_mode": "thread"}
    return modes


def run(quick: bool = False) -> list[dict]:
    from distributed import Client, LocalCluster

    skipped = common.skipped_without_nvml(NAME)
    if skipped:
        return skipped
    rounds, sizes = (2, (500, 2000, 500)) if quick else (7, (2000, 3000, 750))
    modes = array_modes()
    short_modes = {"off": {}, "on @50 ms": {"interval_ms": 50}}
    if common.has_sampler_mode():
        short_modes["on @50 ms, sampler_mode=thread"] = {"interval_ms": 50, "sampler_mode": "thread"}
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        monitored(client, sizes, 200)  # warm-up: imports, plugin pickles, BLAS
        runs = common.alternate(
            {mode: (lambda kw=kw: monitored(client, sizes, **kw)) for mode, kw in modes.items()}, rounds
        )
        short_rounds, n_short = (3, 1000) if quick else (SHORT_ROUNDS, 4000)
        short = common.alternate(
            {
                mode: (lambda kw=kw: monitored(client, (n_short,), work=short_tasks, **kw))
                for mode, kw in short_modes.items()
            },
            short_rounds,
        )
    launch_rounds, steps = (3, LAUNCHES // 4) if quick else (LAUNCH_ROUNDS, LAUNCHES)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        monitored(client, (steps // 10,), 50, work=launch_bound, gpus=1)  # warm-up
        loop = common.alternate(
            {
                mode: (lambda kw=kw: monitored(client, (steps,), work=launch_bound, gpus=1, **kw))
                for mode, kw in short_modes.items()
            },
            launch_rounds,
        )
    off = runs.pop("off")
    rows = [_row(mode, on, off, rounds, target=TARGET if mode == "on @200 ms" else None) for mode, on in runs.items()]
    short_off, loop_off = short.pop("off"), loop.pop("off")
    off_runs = ", ".join(f"{r['seconds']:.3f}" for r in loop_off)
    rows += [
        _row(
            mode,
            on,
            loop_off,
            launch_rounds,
            target=LAUNCH_TARGET if mode == "on @50 ms" else None,
            what=f"launch-bound loop (1 task, {steps:,} tiny calls)",
            workers=1,
            note=(
                f"1 worker x 1 thread, the other core free; {common.gpus_label(1)}; the loop's own wall time "
                f"(off runs {off_runs} s); "
            ),
        )
        for mode, on in loop.items()
    ]
    rows += [
        _row(
            mode,
            on,
            short_off,
            short_rounds,
            target=TARGET if mode == "on @50 ms" else None,
            what=f"{n_short} short pure-Python tasks",
            note="per-task monitoring costs (transition(), a task-stream point per task, wakes); ",
        )
        for mode, on in short.items()
    ]
    wall = [r["seconds"] for r in off]
    rows.append(
        common.row(
            NAME,
            "noise: spread of the monitor-off runs ((max-min)/median)",
            (max(wall) - min(wall)) / common.median(wall),
            "ratio",
            notes=(
                f"off runs {', '.join(f'{x:.2f}' for x in wall)} s; workload: {sizes[0]} small tasks, "
                f"{sizes[1]}^2 float64 array in {sizes[2]}^2 chunks (transpose-add, matmul slab, std); "
                "2 worker processes x 1 thread"
            ),
            details={"runs": off},
        )
    )
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
