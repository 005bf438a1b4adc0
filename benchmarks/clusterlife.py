"""What monitoring adds to a cluster's start and close (issue 48): plain vs monitored from boot, alternated.

Each round starts a LocalCluster (2 workers x 1 thread), runs one small task, waits 1 s (the agent is up and
sampling by then) and closes it; the monitored variant installs the monitor on the scheduler from boot
(``distributed.scheduler.preload: [dask_influx_metrics.preload]``), 1 simulated GPU, the spool sink, every
metric @200 ms. Timed: ``LocalCluster(...)`` returning (start) and ``close()`` returning (close), what a
program or a test suite that builds many clusters waits for; also this process's CPU per round (scheduler,
workers with ``processes=False``, our plugins) and the host agent's own CPU (a process of its own, read from
``/proc`` until it exits after its last worker left). Rounds alternate plain and monitored, in-process
workers (as ``gen_cluster`` tests build them) and worker processes (the default ``LocalCluster``); medians.
Baseline: the plain cluster in the same run. Target: start + close <= 1.15x plain (the issue's bound on
distributed's own test suite, which builds hundreds of clusters).

Run: ``.venv/bin/python -m benchmarks.clusterlife [--quick]``.
"""

from __future__ import annotations

import os
import tempfile
import time

from benchmarks import common

NAME = "clusterlife"
TARGET = 1.15
HOLD_S = 1.0  # the cluster's life between start and close (untimed)


def _agent_pid(client) -> int | None:
    """The host agent's pid, from a worker's link (the beat it reads)."""

    def pid(dask_worker):
        from dask_influx_metrics import _dask
        from dask_influx_metrics.names import WORKER_PLUGIN

        plugin = _dask.worker_plugin(dask_worker, WORKER_PLUGIN)
        beat = plugin.link.beat() if plugin is not None and plugin.link is not None else None
        return beat["pid"] if beat else None

    pids = {p for p in client.run(pid).values() if p}
    return pids.pop() if len(pids) == 1 else None


def _cpu_until_exit(pid: int, timeout: float = 10.0) -> float | None:
    """CPU seconds (user + system) of process ``pid``, read from ``/proc/<pid>/stat`` until it exits (a zombie
    still shows its totals): its whole cost. None if it was gone before the first read."""
    seen, deadline = None, time.monotonic() + timeout
    tick = os.sysconf("SC_CLK_TCK")
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            break
        seen = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15 of stat)
        if fields[0] in ("Z", "X"):
            break
        time.sleep(0.005)
    return seen


def one_round(monitored: bool, processes: bool, spool: str) -> dict:
    import dask
    from distributed import Client, LocalCluster

    config = {"distributed.scheduler.preload": ["dask_influx_metrics.preload"]} if monitored else {}
    with dask.config.set(config):
        cpu, t0 = time.process_time(), time.perf_counter()
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=":0")
        started = time.perf_counter() - t0
        with Client(cluster) as client:
            assert client.submit(sum, [1, 2, 3]).result() == 6
            time.sleep(HOLD_S)
            agent = _agent_pid(client) if monitored else None
        t1 = time.perf_counter()
        cluster.close()
        closed = time.perf_counter() - t1
        cpu = time.process_time() - cpu
    agent_cpu = _cpu_until_exit(agent) if agent else None
    if monitored and agent is None:
        raise RuntimeError("the monitored cluster had no sampling agent")
    return {"start": started, "close": closed, "cpu": cpu, "agent_cpu": agent_cpu}


def run(quick: bool) -> list[dict]:
    rounds = 3 if quick else 9
    rows = []
    with tempfile.TemporaryDirectory() as spool:
        env = {
            "DASK_INFLUX_METRICS__GPU__SOURCE": "simulated",
            "DASK_INFLUX_METRICS__SINK": "spool",
            "DASK_INFLUX_METRICS__SPOOL__DIRECTORY": spool,
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # worker processes read their settings from the environment
        try:
            import dask

            dask.config.refresh()
            for processes in (False, True):
                kind = "worker processes" if processes else "in-process workers"
                runs = common.alternate(
                    {
                        "plain": lambda p=processes: one_round(False, p, spool),
                        "monitored": lambda p=processes: one_round(True, p, spool),
                    },
                    rounds,
                )
                rows += _rows(runs, kind, rounds)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
            dask.config.refresh()
    return rows


def _rows(runs: dict, kind: str, rounds: int) -> list[dict]:
    def med(variant, key):
        return common.median([r[key] for r in runs[variant]])

    plain_total = med("plain", "start") + med("plain", "close")
    on_total = med("monitored", "start") + med("monitored", "close")
    notes = f"2 workers x 1 thread, {rounds} alternated rounds, medians; baseline: plain LocalCluster"
    ratio = on_total / plain_total
    return [
        common.row(
            NAME,
            f"{kind}: start + close, monitored from boot",
            round(on_total, 3),
            "s",
            baseline=round(plain_total, 3),
            target=f"<= {TARGET}x",
            met=ratio <= TARGET,
            notes=notes,
            details=runs,
        ),
        common.row(NAME, f"{kind}: start", round(med("monitored", "start"), 3), "s", round(med("plain", "start"), 3)),
        common.row(NAME, f"{kind}: close", round(med("monitored", "close"), 3), "s", round(med("plain", "close"), 3)),
        common.row(
            NAME,
            f"{kind}: this process's CPU per round (start, a task, {HOLD_S:.0f} s, close)",
            round(med("monitored", "cpu"), 3),
            "s",
            round(med("plain", "cpu"), 3),
        ),
        common.row(
            NAME,
            f"{kind}: the host agent's CPU per cluster (its whole life)",
            round(med("monitored", "agent_cpu"), 3),
            "s",
            notes="a process of its own: Python start, imports, ~6 samples, exit",
        ),
    ]


if __name__ == "__main__":
    common.standalone(NAME, run)
