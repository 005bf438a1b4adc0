"""Contract-shaped ``host``, ``disk``, ``gpu`` and ``dag`` points of two nodes (schema.py), for the node rows of the
summary (issue 47), the report's node tables and the MLflow export, with hand-computed answers.

Every 100 ms, 30 samples. node-a runs workers W0 and W1 (one GPU each), node-b runs W2 (one GPU). Job 1 runs on
W0 in samples 5-14, job 2 on W1 and W2 in samples 10-24. Each host point carries the jobs of every worker of its
host (the agent's union tags). Per sample window: node-a reads 1 MiB and writes 2 MiB, sends and receives 3 MiB
on loopback and 1 MiB externally; node-b the same, except that its counters start over at sample 20 (a reboot:
that window is left out). CPU: 50 % (one of 2 cores at 100, the other at 0) while a job runs, else 5 % (core
max 10, min 0); memory 40 % busy, 20 % idle; disks: node-a's / at 70 % and /dev/shm at 1 %, node-b's / at 30 %.
GPU utilization: 90 % while the worker's job runs, else 0.
"""

from __future__ import annotations

import os

from dask_influx_metrics import lineprotocol
from dask_influx_metrics.schema import Point
from dask_influx_metrics.sinks.spool import SpoolSink

T0 = 1_764_000_000_000_000_000
STEP = 100_000_000
N = 30
MIB = 1 << 20
WORKERS = {"W0": "tcp://10.0.0.1:1001", "W1": "tcp://10.0.0.1:1002", "W2": "tcp://10.0.0.2:1001"}
HOSTS = {"W0": "node-a", "W1": "node-a", "W2": "node-b"}
RUNS = {"W0": (1, range(5, 15)), "W1": (2, range(10, 25)), "W2": (2, range(10, 25))}
DISKS = {"node-a": {"/": 70.0, "/dev/shm": 1.0}, "node-b": {"/": 30.0}}
RESET = {"node-b": 20}  # the sample at which that host's counters start over
PER_WINDOW = {"read": 1, "write": 2, "lo": 3, "ext": 1}  # MiB per sample window


def _tags(worker: str, i: int) -> tuple[str, str]:
    job, samples = RUNS[worker]
    if i in samples:
        return str(job), str(job)
    return (str(job) if i >= samples.stop else "0"), "0"


def _union(host: str, i: int) -> tuple[str, str]:
    mine = [_tags(w, i) for w in WORKERS if HOSTS[w] == host]
    busy = sorted({int(j) for j, d in mine if d != "0"})
    if busy:
        return ",".join(map(str, busy)), ",".join(map(str, busy))
    return mine[0][0], "0"


def _counter(host: str, i: int, mib: int) -> int:
    start = RESET.get(host)
    if start is not None and i >= start:
        return (i - start) * mib * MIB  # started over at 0
    return (1000 + i * mib) * MIB


def host_points(host: str) -> list[Point]:
    first = next(w for w in WORKERS if HOSTS[w] == host)
    out = []
    for i in range(N):
        job, dag = _union(host, i)
        tags = {"host": host, "worker": WORKERS[first], "job": job, "dag": dag}
        busy = dag != "0"
        fields = {
            "cpu_percent": 50.0 if busy else 5.0,
            "cpu_percent_core_max": 100.0 if busy else 10.0,
            "cpu_percent_core_min": 0.0,
            "cpu_count": 2,
            "memory_used_percent": 40.0 if busy else 20.0,
            "disk_read_bytes": _counter(host, i, PER_WINDOW["read"]),
            "disk_write_bytes": _counter(host, i, PER_WINDOW["write"]),
        }
        for kind in ("lo", "ext"):
            for d in ("sent", "recv"):
                fields[f"net_{d}_{kind}_bytes"] = _counter(host, i, PER_WINDOW[kind])
        time = T0 + i * STEP
        out.append(Point("host", tags, fields, time))
        for path, used in DISKS[host].items():
            out.append(Point("disk", {**tags, "path": path}, {"used_percent": used, "used": 1, "total": 2}, time))
    return out


def gpu_points(worker: str) -> list[Point]:
    out = []
    for i in range(N):
        job, dag = _tags(worker, i)
        tags = {"host": HOSTS[worker], "worker": WORKERS[worker], "job": job, "dag": dag}
        tags.update(index="0", nvml_index="0", uuid=f"GPU-{worker}", name="H200")
        fields = {"utilization_gpu": 90.0 if dag != "0" else 0.0, "memory_used": 1000.0, "memory_total": 141000.0}
        out.append(Point("gpu", tags, fields, T0 + i * STEP))
    return out


def dag_points() -> list[Point]:
    out = []
    for job, samples in {1: RUNS["W0"][1], 2: RUNS["W1"][1]}.items():
        for event, at in (("submit", samples.start), ("end", samples.stop)):
            fields = {"event": event, "tasks": 1, "label": f"job{job}", "dag": str(job)}
            fields["status"] = "running" if event == "submit" else "ok"
            if event == "end":
                fields["duration"] = len(samples) * STEP / 1e9
            out.append(Point("dag", {"host": "sched", "job": str(job)}, fields, T0 + at * STEP - 1))
    return out


def write_spool(root) -> str:
    """One session folder under ``root`` as the agents (one per node) and the scheduler write it; returns root."""
    session = os.path.join(os.fspath(root), "20251124T120000-000001")
    folders = {
        "agent-node-a": host_points("node-a") + gpu_points("W0") + gpu_points("W1"),
        "agent-node-b": host_points("node-b") + gpu_points("W2"),
        "scheduler": dag_points(),
    }
    for name, points in folders.items():
        sink = SpoolSink(os.path.join(session, name))
        sink.send(lineprotocol.encode_many(points))
        sink.close()
    return os.fspath(root)
