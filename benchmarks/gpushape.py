"""Issue 33's design measurement: the points of a GPU that several workers share, in two shapes.

- **per worker** (what the agent writes): one ``gpu`` point per (GPU, worker) at each sample, the
  device-wide fields and that worker's own per-worker fields, tagged with that worker's jobs;
- **owner** (before): one device point under the GPU's first worker (union job tags), and a per-worker
  point (its GPU memory, its share) for each other worker; a reader then joins the owner's device rows
  to the worker's own rows by ``uuid`` and time.

The points come from the replayed H200 (``tests/data/nvml_h200_shared.json``: GPM, per-process
utilization, every field the agent reads) through the agent's own :class:`HostCollector`, N workers on
the one GPU, a sample every 200 ms. Measured: points and bytes of line protocol per sample; then, with
the points in a throw-away influxd and in a spool, the time to read the GPU rows of one worker that is
not the owner, device and own fields: per worker, one ``WHERE worker=...`` read; owner, that read plus
the owner's device rows joined as of time; and :func:`.tables.worker_tables` on each shape (on the owner
shape it has no device column for that worker: what the join would add). Not in the benchmark runner
(a one-off)::

    python -m benchmarks.gpushape [--workers 2] [--samples 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import pandas as pd

from benchmarks import common, receivers

ROOT = common.ROOT
sys.path.insert(0, os.path.join(ROOT, "tests"))

T0, STEP = 1_790_000_000_000_000_000, 200_000_000
METRICS = ["compute-util", "total-mem", "worker-gpu-mem", "gpu.sm_active"]


class _Worker:
    def __init__(self, n: int, pid: int):
        from dask_influx_metrics.link.snapshot import Snapshot

        self.id, self.pid, self.address = str(n), pid, f"tcp://127.0.0.1:{40000 + n}"
        self.tags, self.uuids, self.visible = {"host": "node", "worker": self.address}, [], None
        self.snap = Snapshot(((f"task-{n}", n + 1, n + 1),), 1, 0, n + 1)  # each runs its own job

    def snapshot(self):
        return self.snap

    def offset(self):
        return int(self.id) * 0.0007  # each worker's clock offset differs by a fraction of a ms

    def read(self, snap=None):
        return {}


def points_per_worker(workers: int, samples: int) -> list:
    """The agent's points: the replayed H200 read once per sample, one gpu point per worker."""
    from fake_nvml import FakeNvml

    from dask_influx_metrics.sampling.collect import HostCollector
    from dask_influx_metrics.sampling.sources.nvml import NvmlDevices
    from dask_influx_metrics.schema import FIELDS, GPU

    fields = frozenset(k for k in FIELDS if k[0] == GPU)
    pids = [666, 668] + [700 + i for i in range(workers - 2)]
    gpus = NvmlDevices(fields, nvml=FakeNvml("nvml_h200_shared.json"))
    crew = [_Worker(i, pids[i]) for i in range(workers)]
    for w in crew:
        w.uuids = gpus.resolve(w)
    gpus._devices[crew[0].uuids[0]].procs._interval = 5 * STEP / 1e9  # a share each 5th sample (1 s)
    collector = HostCollector(fields, gpus, host=None)
    out = []
    for k in range(samples):
        out += collector.collect(crew, now_ns=T0 + k * STEP)
    return out


def owner_shape(points: list) -> list:
    """The same readings as the owner wrote them: device fields once under the first worker, tagged with the
    union of the jobs, the per-worker fields on points of their own (the owner's joined the device point
    only when its own tags equalled the union: not here, each worker runs its own job)."""
    from dask_influx_metrics import jobtags
    from dask_influx_metrics.schema import Point

    out, by_time = [], {}
    for p in points:
        by_time.setdefault(p.time_ns // STEP, []).append(p)
    for ps in by_time.values():
        owner = ps[0]
        jobs = jobtags.format(j for p in ps for j in jobtags.parse(p.tags["job"]))
        dags = jobtags.format(d for p in ps for d in jobtags.parse(p.tags["dag"]))
        device = {k: v for k, v in owner.fields.items() if not k.startswith("worker_")}
        out.append(Point(owner.measurement, {**owner.tags, "job": jobs, "dag": dags}, device, owner.time_ns))
        for p in ps:
            mine = {k: v for k, v in p.fields.items() if k.startswith("worker_")}
            if mine:
                out.append(Point(p.measurement, p.tags, mine, p.time_ns))
    return out


DEVICE = ["utilization_gpu", "memory_used", "sm_active"]


def _own_rows(db, worker: str, owner: str):
    """The per-worker shape: the worker's rows of its GPU, device fields included: one read."""
    return db.backend.frame("gpu", [*DEVICE, "worker_memory_used"], worker)


def _joined_rows(db, worker: str, owner: str):
    """The owner shape: the worker's own rows, and the owner's device rows of its GPU joined as of time."""
    own = db.backend.frame("gpu", ["worker_memory_used"], worker)
    device = db.backend.frame("gpu", DEVICE, owner)
    left, right = own.sort_values("time"), device.drop(columns=["job", "dag"]).sort_values("time")
    return pd.merge_asof(left, right, on="time", by="index", direction="nearest", tolerance=STEP // 2)


def _timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def main() -> None:
    from dask_influx_metrics import lineprotocol, query
    from dask_influx_metrics.sinks.spool import SpoolSink

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    shapes = {"per worker": points_per_worker(args.workers, args.samples)}
    shapes["owner"] = owner_shape(shapes["per worker"])
    owner, other = (f"tcp://127.0.0.1:{40000 + n}" for n in (0, 1))
    print(f"{args.workers} workers sharing one replayed H200, {args.samples} samples at 200 ms")
    with receivers.influxd() as server, tempfile.TemporaryDirectory() as tmp:
        for name, points in shapes.items():
            lines = lineprotocol.encode_many(points)
            per = len(points) / args.samples, sum(len(line) + 1 for line in lines) / args.samples
            db = server.create_database("shape_" + name.replace(" ", "_"))
            for k in range(0, len(lines), 5000):
                server.write(b"\n".join(lines[k : k + 5000]), db=db).raise_for_status()
            folder = os.path.join(tmp, name.replace(" ", "_"), "20260101T000000-000001", "agent-node")
            sink = SpoolSink(folder)
            sink.send(lines)
            sink.close()
            sources = {"influxql": (server.url, {"database": db}), "spool": (os.path.dirname(folder), {})}
            read = _own_rows if name == "per worker" else _joined_rows
            print(f"{name}: {per[0]:.1f} points and {per[1]:.0f} bytes of line protocol per sample")
            for kind, (source, options) in sources.items():
                with query.connect(source, **options) as store:
                    rows = _timed(lambda: read(store, other, owner), args.rounds)
                    table = _timed(lambda: query.worker_tables(store, metrics=METRICS, workers=[other]), args.rounds)
                print(
                    f"  {kind:8s}: worker {other}'s GPU rows (device and own fields) in {rows:.1f} ms; "
                    f"worker_tables() in {table:.1f} ms (medians of {args.rounds})"
                    + ("" if name == "per worker" else " (holds no device column: the owner has them)")
                )


if __name__ == "__main__":
    main()
