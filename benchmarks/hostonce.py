"""Host readings per node: ``sampler.host-once`` (the default) vs off, N workers on one host.

N samplers of one host and session (built by ``build_sampler``, as each worker's
plugin does; every metric, no GPU source, a sink that drops the lines) take R
rounds of one sample each, back to back. Per round (one polling interval) it
counts the ``host`` points written on the node (the host series written per
interval: one per writing worker), the host counter reads (one per sampler that
read ``/proc/stat``, ``/proc/meminfo``, disk and net counters), and the thread
CPU of all N samples together (the host's writer also reads its peers' activity:
one ``listdir`` and one buffer read per peer). Samplers of one process stand in
for worker processes (each publishes its own file; the host lock is per open
file, so only one of them holds it). Informational: no target.

Run: ``.venv/bin/python -m benchmarks.hostonce [--quick]``.
"""

from __future__ import annotations

import os
import time
import uuid

from benchmarks import common
from dask_influx_metrics.config import Settings
from dask_influx_metrics.schema import HOST
from dask_influx_metrics.worker.build import build_sampler
from dask_influx_metrics.worker.sources.activity import CachedActivity, TaskRegistry
from dask_influx_metrics.worker.sources.host import HostSource

NAME = "hostonce"


class _Drop:
    def send(self, lines):
        pass

    def close(self):
        pass


def measure(n: int, host_once: bool, rounds: int) -> dict:
    """Per round: host points, host counter reads, thread CPU (us) of the N samples."""
    settings = Settings.resolve({"gpu.source": "none", "sampler.host-once": host_once, "sink": "udp"})
    session = f"bench-hostonce-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    samplers, reads = [], [0]
    for i in range(n):
        registry = TaskRegistry(nthreads=2)
        registry.started(("task", i), job=1 + i % 2, dag=1 + i)  # every worker busy: tags change per worker
        sampler, _ = build_sampler(settings, session, f"tcp://10.0.0.1:{i}", {"host": "node", "worker": f"w{i}"},
                                   CachedActivity(registry), clock_offset=lambda: 0.0, report=print, sink=_Drop())
        host = next(s for s in sampler.sources if isinstance(s, HostSource))
        call = host._calls[(HOST, "memory")]  # one group stands for the host read (all groups read together)
        host._calls[(HOST, "memory")] = lambda call=call: reads.__setitem__(0, reads[0] + 1) or call()
        samplers.append(sampler)
    points, cpu = 0, 0.0
    try:
        for s in samplers:  # warm up: the lock is taken, files opened
            s.sample()
        reads[0] = 0
        for _ in range(rounds):
            for s in samplers:
                t0 = time.thread_time()
                points += sum(p.measurement == HOST for p in s.sample())
                cpu += time.thread_time() - t0
    finally:
        for s in samplers:
            s.stop()
    return {"host_points": points / rounds, "host_reads": reads[0] / rounds, "cpu_us": cpu / rounds * 1e6}


def run(quick: bool) -> list[dict]:
    rounds = 50 if quick else 300
    rows = []
    for n in ((2, 8) if quick else (2, 4, 8)):
        got = common.alternate({"on": lambda: measure(n, True, rounds), "off": lambda: measure(n, False, rounds)},
                               rounds=3)
        on = {k: common.median([r[k] for r in got["on"]]) for k in got["on"][0]}
        off = {k: common.median([r[k] for r in got["off"]]) for k in got["off"][0]}
        rows += [
            common.row(NAME, f"{n} workers on one host: host points (= series) written per interval, host-once vs off",
                       on["host_points"], "points", baseline=off["host_points"]),
            common.row(NAME, f"{n} workers on one host: host counter reads per interval, host-once vs off",
                       on["host_reads"], "reads", baseline=off["host_reads"]),
            common.row(NAME, f"{n} workers on one host: sampler CPU per interval, all workers, host-once vs off",
                       round(on["cpu_us"]), "us", baseline=round(off["cpu_us"]),
                       notes="every metric, no GPU; the writer also reads its peers' activity"),
        ]
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
