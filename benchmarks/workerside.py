"""What the worker process pays for being monitored, per sample and per task (part of :mod:`benchmarks.sampler`).

A LocalCluster of one worker process (1 thread), idle, sampled at 50 ms (8
simulated GPUs, every metric, UDP into a bound loopback socket nobody reads),
in rotation: monitor off; the default configuration (the host's sampling agent,
a separate process, samples; the worker keeps a thread for the task stream); the
same without the task stream and fine metrics (the worker only publishes); and
in-process (``sampler_mode="thread"``). The worker's CPU is the sum over its threads of
``/proc/<pid>/task/<tid>/schedstat`` (ns), over ``seconds`` per variant, so a
variant's cost per sample is (its CPU - the off median) / its samples. The
agent's own CPU per sample is taken the same way from its pid. Per task: the
worker CPU of ``WorkerPlugin.transition`` for the 5 transitions of one task
(two start or end an execution), batches of 100 tasks 20 ms apart on the
monitored worker, timed inside it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

from benchmarks import common
from benchmarks.common import process_cpu_ns

INTERVAL_MS = 50
NO_STREAM = "default without the task stream (worker only publishes)"


def _probe(dask_worker) -> tuple[int, int | None]:
    """(samples taken for this worker so far, the sampling agent's pid or None)."""
    plugin = dask_worker.plugins.get("influx-metrics")
    if plugin is None:
        return 0, None
    if getattr(plugin, "link", None) is not None:  # the host's agent samples: its beat counts
        beat = plugin.link.beat() or {}
        return beat.get("samples", 0), beat.get("pid")
    own = common.own_sampler(plugin)
    return (own.samples if own is not None else 0), None


async def _per_task_us(dask_worker, batches: int = 20, size: int = 100, pause: float = 0.02) -> float:
    """Worker CPU us of ``transition`` for one task's 5 transitions (runs inside the worker, on its event loop):
    ``batches`` of ``size`` tasks, ``pause`` s apart, the loop free meanwhile (what it does between tasks: the
    Publisher's deferred write, and the agent's sample acknowledging it, come then and are not counted)."""
    plugin = dask_worker.plugins["influx-metrics"]
    spent, n = 0, 0
    for batch in range(batches):
        keys = [("bench-0123456789abcdef", batch * size + i) for i in range(size)]
        t = time.thread_time_ns()
        for k in keys:
            plugin.transition(k, "released", "waiting")
            plugin.transition(k, "waiting", "ready")
            plugin.transition(k, "ready", "executing")
            plugin.transition(k, "executing", "memory")
            plugin.transition(k, "memory", "released")
        spent += time.thread_time_ns() - t
        n += len(keys)
        await asyncio.sleep(pause)  # the sampler samples (and acknowledges) between batches
    return spent / n / 1000


def _variants() -> dict:
    from dask_influx_metrics import schema

    no_stream = [t for t in schema.TRACKING if t not in ("task-stream", "fine-metrics")]
    out = {"off": None, "default (agent)": {}, NO_STREAM: {"tracking": no_stream}}
    if common.has_sampler_mode():
        out["sampler_mode=thread (in-process)"] = {"sampler_mode": "thread"}
    return out


def measure(seconds: float, rounds: int) -> dict:
    """{variant: [(worker us per sample, agent us per sample or None, worker us per task or None), ...]}."""
    from distributed import Client, LocalCluster

    from dask_influx_metrics import Monitor

    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    address = "%s:%d" % receiver.getsockname()
    try:
        with (
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
            Client(cluster) as client,
        ):
            [pid] = client.run(os.getpid).values()

            def one(settings):
                m = None
                if settings is not None:
                    m = Monitor(client, sink="udp", telegraf_address=address, **common.gpu_settings())
                    m.attach(polling_interval=INTERVAL_MS, **settings)
                    m.start()
                try:
                    time.sleep(1.0)  # past the first samples
                    [(s0, side)] = client.run(_probe).values()
                    cpu0, side0 = process_cpu_ns(pid), process_cpu_ns(side) if side else 0
                    time.sleep(seconds)
                    [(s1, _)] = client.run(_probe).values()
                    cpu, side_cpu = process_cpu_ns(pid) - cpu0, (process_cpu_ns(side) - side0) if side else None
                    per_task = next(iter(client.run(_per_task_us).values())) if m is not None else None
                finally:
                    if m is not None:
                        m.shutdown()
                samples = max(1, s1 - s0) if m is not None else seconds / INTERVAL_MS * 1000
                return cpu / 1000, samples, side_cpu and side_cpu / 1000 / samples, per_task

            runs = common.alternate({name: (lambda s=s: one(s)) for name, s in _variants().items()}, rounds)
    finally:
        receiver.close()
    off = common.median([cpu for cpu, *_ in runs.pop("off")])
    return {name: [((cpu - off) / samples, side, task) for cpu, samples, side, task in rs] for name, rs in runs.items()}


def rows(name: str, floor: float, quick: bool) -> list[dict]:
    """The benchmark rows, against ``floor`` (us per tick of an empty thread @50 ms + one 1 kB datagram)."""
    seconds, rounds = (2.0, 1) if quick else (8.0, 3)
    runs = measure(seconds, rounds)
    out = []
    for variant, results in runs.items():
        worker = common.median([w for w, _, _ in results])
        default = variant == "default (agent)"
        agent = [s for _, s, _ in results if s is not None]
        task = [t for _, _, t in results if t is not None]
        out.append(
            common.row(
                name,
                f"worker process pays per sample @50 ms, idle worker, {variant}, vs floor",
                worker,
                "us",
                baseline=floor,
                target="<= 3x floor" if default else None,
                met=worker <= 3 * floor if default else None,
                notes=(
                    f"(worker CPU - monitor off) / samples; runs {', '.join(f'{w:.0f}' for w, _, _ in results)} us; "
                    f"{rounds}x{seconds:.0f} s alternated with monitor off"
                    + (f"; the agent's own CPU {common.median(agent):.0f} us per sample" if agent else "")
                    + (
                        f"; transition() {common.median(task):.1f} us worker CPU per task (5 transitions)"
                        if task
                        else ""
                    )
                ),
            )
        )
        if agent and default:
            out.append(
                common.row(
                    name,
                    "sampling agent process CPU per sample @50 ms (informational)",
                    common.median(agent),
                    "us",
                    baseline=floor,
                    notes=f"every metric, {common.gpus_label(8)}; its own process, out of the worker's GIL",
                )
            )
    return out
