"""What the 4,000 short tasks row can resolve: many alternated pairs, the ratio with its 95 % interval.

A standalone script, not in ``MODULES`` (about 15 s a pair). The ``workload`` benchmark's short-task
row takes 9 alternated rounds; on a 2-core VM one pair's ratio scatters by ~5 %, so the median of 9
has an interval of about +-4 %: wider than the 2 % target. This runs the same round (``workload.
short_tasks``, 2 workers x 1 thread, 8 simulated GPUs, every metric, UDP to a drained socket) off and
on @50 ms (the default configuration), ``--pairs`` times alternated, on a fresh cluster or, with
``--after-array N``, after N rounds of the benchmark's five array modes (its cluster's state when
its short rounds start: N = 7). Reported: the ratio of the medians, the per-pair ratio median with
its distribution-free 95 % interval (:func:`benchmarks.common.median_interval`) and the mean; and the CPU
a round costs (the worker processes with the agent, the scheduler's process: as noisy here as the wall time,
an idle-spinning or busy worker's own CPU moves by ~0.5 s a round), and what the monitor itself spent in an
"on" round, per thread (the agent + the monitor's threads in the workers; the hooks on a worker's event loop are
``benchmarks.pertask``'s).

``--control`` adds a third round to each pair, the benchmark's "attached only" mode (the scheduler plugin
installed, no session: nothing sampled, no task tagged), and rotates the three rounds' order from one set
to the next: its ratio to off is what the instrument reads for a monitor that costs next to nothing.

``--burn`` adds another third round, "off + burner": the monitor off, and a separate process that spends the CPU
the monitor itself spent in the "on" rounds so far (their median rate: the agent + its threads in the workers),
busy-looping, in one burst every polling interval of the "on" rounds (50 ms; the graph's 200 ms), as the agent
spends it. Its ratio to off is what that much CPU costs the workload on this machine whoever
spends it; the rest of "on"'s is the monitor's own doing (the hooks on the event loops, the tagging, what its
threads and datagrams do to the processes they share the cores with).

``--lean`` adds another third round, "on" without the task stream and fine metrics (``tracking``: every other
name): no per-task point is made, written, forwarded or sent. Its ratio to "on" is what those two cost the round.

``--graph`` runs issue 46's other per-task row instead: one graph of about 50,000 tasks (:func:`graph_tasks`)
per round on the same 2 workers, the monitor at its default polling interval (200 ms); results in
``graphpairs.json``.

Run: ``.venv/bin/python -m benchmarks.shortpairs [--pairs 24] [--after-array 7] [--seconds S]
[--control | --burn | --lean] [--graph]``; with ``BENCH_GPU_SOURCE=nvml`` the agent reads the node's own GPUs
instead of 8 simulated ones per worker.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import time

from benchmarks import common, workload
from dask_influx_metrics import schema

INTERVAL_MS = 50  # the short round's polling interval (the graph's: the default)
NOT_LEAN = ("task-stream", "fine-metrics")  # the tracking names a "lean" round leaves out
MODES = {
    "off": {},
    "on": {"interval_ms": INTERVAL_MS},
    "attached": {"interval_ms": INTERVAL_MS, "start": False},
    "burn": {},
    "lean": {"interval_ms": INTERVAL_MS, "tracking": [t for t in schema.TRACKING if t not in NOT_LEAN]},
}
NAMES = {"attached": "attached only", "burn": "off + burner", "lean": "on without the task stream"}  # in the output
GRAPH_TASKS = 50_000  # issue 46: a 50,000-task graph, 2 workers, default settings


def graph_tasks(client, n: int) -> float:
    """One graph of about ``n`` tasks (``taskstream.graph``: inc tasks summed in groups of 100, then once
    more), computed with ``client.get``; wall time in seconds."""
    from benchmarks import taskstream

    dsk, key = taskstream.graph(round(n * taskstream.GROUP / (taskstream.GROUP + 1)))
    t0 = time.perf_counter()
    client.get(dsk, key)
    return time.perf_counter() - t0


def _burn(stop, share: float, period: float) -> None:
    """Busy-loop ``share`` of one core (thread CPU) in each ``period`` s until ``stop`` is set."""
    while not stop.is_set():
        t = time.thread_time()
        while time.thread_time() - t < share * period:
            pass
        stop.wait(period * (1 - share))


@contextlib.contextmanager
def burning(share: float, period: float):
    """A separate process spending ``share`` of a core meanwhile, in a burst every ``period`` s (none when 0)."""
    if not share:
        yield
        return
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=_burn, args=(stop, share, period), daemon=True)
    proc.start()
    try:
        yield
    finally:
        stop.set()
        proc.join(5)


def pairs(
    n: int,
    after_array: int = 0,
    seconds: float | None = None,
    third: str | None = None,
    graph: bool = False,
) -> dict:
    """``{"off": [s, ...], "on": [s, ...]}`` (and ``third``'s, a key of :data:`NAMES`): the rounds' wall times,
    alternated (with a third round, the order rotates by one each set); no new set starts once ``seconds`` have
    passed (a lent GPU machine's command has a time limit); ``"burn"``: an "off + burner" round (the module's
    docstring; it follows an "on" round in the first set). Each set is printed as it ends, so that a run stopped from
    outside still leaves its rounds in the log. ``graph``: the rounds run :func:`graph_tasks` with the monitor at its
    default polling interval instead of the short tasks @50 ms."""
    from distributed import Client, LocalCluster

    from dask_influx_metrics import config

    sizes = (2000, 3000, 750)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        workload.monitored(client, (1000,), 50, work=workload.short_tasks)  # warm-up
        for _ in range(after_array):
            for kw in workload.array_modes().values():
                workload.monitored(client, sizes, **kw)
        deadline = None if seconds is None else time.monotonic() + seconds
        modes = ["off", "on", third] if third else ["off", "on"]
        work, sizes = (graph_tasks, (GRAPH_TASKS,)) if graph else (workload.short_tasks, (4000,))
        settings = {mode: dict(MODES[mode]) for mode in modes}
        if graph:  # the default settings: the monitor's own polling interval
            for mode in modes:
                if "interval_ms" in settings[mode]:
                    settings[mode]["interval_ms"] = config.value("polling-interval")
        runs: dict = {mode: [] for mode in modes}
        cpu: dict = {mode: [] for mode in modes}
        while len(runs["on"]) < n and (deadline is None or time.monotonic() < deadline):
            k = len(runs["on"]) % len(modes) if len(modes) > 2 else 0
            for mode in modes[k:] + modes[:k]:
                share = statistics.median(c[2] / s for c, s in zip(cpu["on"], runs["on"])) if mode == "burn" else 0
                with burning(share, settings["on"]["interval_ms"] / 1000):  # at the monitor's own rhythm
                    r = workload.monitored(client, sizes, work=work, **settings[mode])
                runs[mode].append(r["seconds"])
                cpu[mode].append([r["cpu"], r["scheduler_cpu"], r["monitor_cpu"]])
            shown = ", ".join(f"{mode} {runs[mode][-1]:.3f} s ({sum(cpu[mode][-1][:2]):.2f} s CPU)" for mode in modes)
            print(f"pair {len(runs['on'])}: {shown}", flush=True)
    return runs, cpu


def summary(off: list, on: list) -> str:
    """The ratios of ``on`` to ``off``, pair by pair: their medians' ratio, the per-pair median with its
    95 % interval, the mean."""
    ratios = [a / b for a, b in zip(on, off)]
    interval = common.median_interval(ratios)
    shown = f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "(too few pairs for one)"
    return (
        f"{len(ratios)} pairs: ratio of medians {statistics.median(on) / statistics.median(off):.3f}; "
        f"per-pair ratio median {statistics.median(ratios):.3f}, 95 % interval {shown}; "
        f"mean {statistics.mean(ratios):.3f}"
    )


def cpu_summary(off: list, on: list, name: str = "on") -> str:
    """What the rounds cost in CPU: the medians of the worker processes with the agent, and of the scheduler's
    process, and the per-pair difference of their sum."""
    med = [statistics.median(c[i] for c in rounds) for rounds in (off, on) for i in (0, 1)]
    more = statistics.median(sum(a[:2]) - sum(b[:2]) for a, b in zip(on, off))
    own = statistics.median(c[2] for c in on) if on[0][2] is not None else None
    return (
        f"CPU a round, workers + agent / scheduler: off {med[0]:.3f} / {med[1]:.3f} s,"
        f" {name} {med[2]:.3f} / {med[3]:.3f} s;"
        f" per-pair difference of the sum, median {more:+.3f} s"
        + (f"; the monitor's own (the agent + its threads in the workers), median {own:.3f} s" if own else "")
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.shortpairs", description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=24, help="alternated off/on pairs (default 24)")
    p.add_argument("--seconds", type=float, help="start no new pair after this many seconds")
    p.add_argument("--after-array", type=int, default=0, metavar="N", help="N rounds of the array modes first")
    third = p.add_mutually_exclusive_group()
    third.add_argument(
        "--control", dest="third", action="store_const", const="attached", help="an attached-only round in each set"
    )
    third.add_argument(
        "--burn", dest="third", action="store_const", const="burn", help="an off + burner round (the monitor's CPU)"
    )
    third.add_argument(
        "--lean",
        dest="third",
        action="store_const",
        const="lean",
        help="an on round without the task stream and fine metrics",
    )
    p.add_argument("--graph", action="store_true", help="the 50,000-task graph at the default settings instead")
    args = p.parse_args()
    runs, cpu = pairs(args.pairs, args.after_array, args.seconds, args.third, args.graph)
    print("on vs off:", summary(runs["off"], runs["on"]))
    print("on vs off:", cpu_summary(cpu["off"], cpu["on"]))
    if args.third:
        name = NAMES[args.third]
        print(f"{name} vs off:", summary(runs["off"], runs[args.third]))
        print(f"{name} vs off:", cpu_summary(cpu["off"], cpu[args.third], name))
        print(f"on vs {name}, paired:", summary(runs[args.third], runs["on"]))
    for mode, seconds in runs.items():
        print(f"{mode:3s} {', '.join(f'{s:.2f}' for s in seconds)} s")
    path = common.write_json(
        os.path.join(common.RESULTS_DIR, "graphpairs.json" if args.graph else "shortpairs.json"),
        {
            "env": common.environment(),
            "after_array": args.after_array,
            "gpus": common.gpus_label(8),
            **runs,
            "cpu": cpu,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
