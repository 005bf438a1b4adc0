"""Host readings per node: one sampling agent per host (``sampler.mode: agent``, the default) vs each
worker sampling itself (``sampler.mode: thread``), N workers on one host.

Agent: one :class:`~dask_influx_metrics.sampling.collect.HostCollector` over the N
workers (as the agent builds it: one ``host`` source, one view per worker).
Thread: N collectors of one worker each (as each worker's in-process sampler
builds it). Every metric, no GPU source; R rounds of one sample of every worker,
back to back. Per round (one polling interval) it counts the ``host`` points
written on the node (the host series written per interval), the host counter
reads (``/proc/stat``, ``/proc/meminfo``, disk and net counters) and the thread
CPU of collecting all N workers. Worker views of this process stand in for
worker processes (each reads its own ``/proc/<pid>`` files). Informational: no
target. (Before the agent this compared ``sampler.host-once`` on and off, with
N samplers built by ``worker/build.py`` and a host lock among them.)

Run: ``.venv/bin/python -m benchmarks.hostonce [--quick]``.
"""

from __future__ import annotations

import os
import time

from benchmarks import common
from dask_influx_metrics.sampling.collect import HostCollector
from dask_influx_metrics.sampling.sources.host import HostSource
from dask_influx_metrics.sampling.view import WorkerView
from dask_influx_metrics.schema import HOST, TRACKING, fields_for
from dask_influx_metrics.worker.registry import CachedSnapshot, TaskRegistry

NAME = "hostonce"


def _views(n: int, fields: frozenset) -> list[WorkerView]:
    views = []
    for i in range(n):
        registry = TaskRegistry(nthreads=2)
        registry.started(("task", i), job=1 + i % 2, dag=1 + i)  # every worker busy: tags differ per worker
        info = {"address": f"tcp://10.0.0.1:{i}", "pid": os.getpid(), "tags": {"host": "node", "worker": f"w{i}"}}
        views.append(WorkerView(str(i), info, CachedSnapshot(registry), fields, offset=lambda: 0.0))
    return views


def _counted_host(fields: frozenset, reads: list) -> HostSource:
    host = HostSource(frozenset(f for f in fields if f[0] == HOST))
    call = host._calls[(HOST, "memory")]  # one group stands for the host read (all groups read together)
    host._calls[(HOST, "memory")] = lambda: reads.__setitem__(0, reads[0] + 1) or call()
    return host


def measure(n: int, agent: bool, rounds: int) -> dict:
    """Per round: host points, host counter reads, thread CPU (us) of collecting the N workers."""
    fields = fields_for(TRACKING)
    views, reads = _views(n, fields), [0]
    if agent:
        groups = [(HostCollector(fields, None, _counted_host(fields, reads)), views)]
    else:
        groups = [(HostCollector(fields, None, _counted_host(fields, reads)), [v]) for v in views]
    points, cpu = 0, 0.0
    try:
        for collector, members in groups:  # warm up: files opened, CPU windows primed
            collector.collect(members, time.time_ns())
        reads[0] = 0
        for _ in range(rounds):
            t0 = time.thread_time()
            for view in views:
                view.snapshot.refresh()
            for collector, members in groups:
                points += sum(p.measurement == HOST for p in collector.collect(members, time.time_ns()))
            cpu += time.thread_time() - t0
    finally:
        for collector, _ in groups:
            collector.host.close()
        for view in views:
            view.close()
    return {"host_points": points / rounds, "host_reads": reads[0] / rounds, "cpu_us": cpu / rounds * 1e6}


def run(quick: bool) -> list[dict]:
    rounds = 50 if quick else 300
    rows = []
    for n in (2, 8) if quick else (2, 4, 8):
        got = common.alternate(
            {"agent": lambda n=n: measure(n, True, rounds), "thread": lambda n=n: measure(n, False, rounds)}, rounds=3
        )
        agent = {k: common.median([r[k] for r in got["agent"]]) for k in got["agent"][0]}
        thread = {k: common.median([r[k] for r in got["thread"]]) for k in got["thread"][0]}
        rows += [
            common.row(
                NAME,
                f"{n} workers on one host: host points (= series) written per interval, agent vs thread",
                agent["host_points"],
                "points",
                baseline=thread["host_points"],
            ),
            common.row(
                NAME,
                f"{n} workers on one host: host counter reads per interval, agent vs thread",
                agent["host_reads"],
                "reads",
                baseline=thread["host_reads"],
            ),
            common.row(
                NAME,
                f"{n} workers on one host: sampling CPU per interval, all workers, agent vs thread",
                round(agent["cpu_us"]),
                "us",
                baseline=round(thread["cpu_us"]),
                notes="every metric, no GPU; collecting only (no encode, no send)",
            ),
        ]
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
