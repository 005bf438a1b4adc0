"""The H100 scenario of issue 10 as data: two workers of one host sharing one GPU.

Each worker writes the device-wide fields with its own job/dag tags (as every
worker did before one writer per GPU), plus its own ``worker_memory_used``.
Sampled every 0.5 s:

* phase A (6 samples): worker 0 runs job 1 (4.5-5 GiB of its own); worker 1 is idle;
* phase B (8 samples): worker 1 runs job 2 (16.5 GiB, 100 % util); worker 0 is
  idle (``job="1"``, ``dag="0"``) and still holds 4.5 GiB, its device fields
  showing job 2's memory and utilization;
* phase C (4 samples): worker 0 runs job 3 (a sleep: util 0, memory held);
  worker 1 is idle (``job="2"``, ``dag="0"``) and keeps its 16.5 GiB.

``EXPECTED`` holds what each job's own busy samples hold.
"""

from __future__ import annotations

import contextlib

from dask_influx_metrics import lineprotocol, query
from dask_influx_metrics.schema import Point

HOST = "gpu-node"
W = ["tcp://127.0.0.1:40001", "tcp://127.0.0.1:40002"]
T0 = 1_790_000_000_000_000_000
STEP = 500_000_000  # ns
DEVICE = {"index": "0", "nvml_index": "0", "uuid": "GPU-5d1c0b6e", "name": "NVIDIA H100 80GB HBM3"}
MIB = 2**20

# per sample: (util %, worker 0 MiB, worker 1 MiB, (job, dag) of worker 0, (job, dag) of worker 1)
SAMPLES = (
    [
        (u, m, 0.0, ("1", "1"), ("0", "0"))
        for u, m in zip([55, 60, 65, 70, 62, 58], [4608, 4608, 5120, 5120, 4608, 4608])
    ]
    + [(100, 4608, 16896, ("1", "0"), ("2", "2"))] * 8
    + [(0, 4608, 16896, ("3", "3"), ("2", "0"))] * 4
)

# What each job's busy samples hold, per worker index (device memory in bytes).
EXPECTED = {
    "total-mem": [{1: 5120 * MIB, 3: 21504 * MIB}, {2: 21504 * MIB}],
    "worker-gpu-mem": [{1: 5120 * MIB, 3: 4608 * MIB}, {2: 16896 * MIB}],
    "compute-util": [{1: 70, 3: 0}, {2: 100}],
}
# Whole session (every sample, idle ones too).
EXPECTED_WHOLE = {"total-mem": [21504 * MIB, 21504 * MIB], "compute-util": [100, 100]}


def points() -> list[Point]:
    out = []
    for k, (util, mem0, mem1, *tags) in enumerate(SAMPLES):
        t = T0 + k * STEP
        for worker, own, (job, dag) in zip(W, (mem0, mem1), tags):
            common = {"host": HOST, "worker": worker, "job": job, "dag": dag}
            out.append(
                Point(
                    "gpu",
                    {**common, **DEVICE},
                    {
                        "utilization_gpu": float(util),
                        "memory_used": float(mem0 + mem1),
                        "memory_total": 81559.0,
                        "worker_memory_used": float(own),
                        "clocks_event_reasons": 0 if util else 1,
                    },
                    t,
                )
            )
            out.append(Point("worker", common, {"tasks": int(dag != "0"), "running": "[]"}, t))
    return out


def write_spool(root) -> str:
    """The points as one spool session under ``root``; returns ``root``."""
    session = root / "20260701T000000-000001"
    for i, worker in enumerate(W):
        folder = session / f"worker-{i}"
        folder.mkdir(parents=True)
        lines = lineprotocol.encode_many(p for p in points() if p.tags["worker"] == worker)
        (folder / "spool-1-000000.lp").write_bytes(b"\n".join(lines) + b"\n")
    return str(root)


def write_influx(influxd, db: str) -> None:
    influxd.write(b"\n".join(lineprotocol.encode_many(points())), db=db)


@contextlib.contextmanager
def stores(influxd, folder, db: str):
    """``{"influxql": Store, "spool": Store}`` on the points, written to database ``db`` and under ``folder``."""
    write_influx(influxd, influxd.create_database(db))
    with query.connect(influxd.url, database=db) as influx, query.connect(write_spool(folder)) as local:
        yield {"influxql": influx, "spool": local}
