"""Contract-shaped ``task``, ``activity``, ``gpu`` and ``dag`` points (schema.py) for the client's
task analysis and report tests, and the ways to store them: influxd over HTTP (the encoder), a
spool written by the spool sink, and a Flux answer in InfluxDB 2.x's annotated CSV.

Two workers with two GPUs each, 100 ms apart, 40 samples. Job 1 runs DAG 1 on worker 0 (samples
5-14) and DAG 2 on worker 1 (10-19); job 2 runs DAG 3 on both (25-34). GPU utilization is 80 %
while job 1 runs, 40 % while job 2 runs, 0 idle. ``dag_field=True`` writes ``dag`` (and the dag
points' ``dag``/``status``) as fields, as ``dag-tag: false`` will.
"""

from __future__ import annotations

import os

from dask_influx_metrics import lineprotocol
from dask_influx_metrics.schema import Point
from dask_influx_metrics.sinks.spool import SpoolSink

T0 = 1_763_900_000_000_000_000
STEP = 100_000_000
WORKERS = ["tcp://127.0.0.1:1001", "tcp://127.0.0.1:1002"]
RUNS = {(0, 1, 1): range(5, 15), (1, 1, 2): range(10, 20), (0, 2, 3): range(25, 35), (1, 2, 3): range(25, 35)}
UTIL = {1: 80.0, 2: 40.0}
# (job, dag, prefix, count, duration s, state): the task stream, per worker that ran the DAG
TASKS = [
    (1, 1, "load", 6, 0.1, "memory"),
    (1, 2, "matmul", 4, 0.5, "memory"),
    (2, 3, "matmul", 5, 0.2, "memory"),
    (2, 3, "sum", 1, 0.05, "error"),
]
# (job, prefix, activity, unit, values): fine performance metrics, several deltas each
ACTIVITY = [
    (1, "load", "thread-cpu", "seconds", [0.25, 0.35]),
    (1, "load", "disk-read", "bytes", [1000.0]),
    (1, "matmul", "thread-noncpu", "seconds", [0.5]),
    (2, "matmul", "thread-cpu", "seconds", [0.75, 0.25]),
    (2, "sum", "idle", "seconds", [0.125]),
]


def _state(worker: int, i: int) -> tuple[str, str]:
    """(job, dag) tags of sample ``i``: the running DAG, else idle with the worker's last job."""
    last = "0"
    for (w, job, dag), samples in RUNS.items():  # in time order
        if w == worker and i in samples:
            return str(job), str(dag)
        if w == worker and i >= samples.stop:
            last = str(job)
    return last, "0"


def worker_points(worker: int, dag_field: bool = False) -> list[Point]:
    address, host = WORKERS[worker], "node1"
    out = []
    for i in range(40):
        job, dag = _state(worker, i)
        tags = {"host": host, "worker": address, "job": job, "dag": dag}
        util = UTIL[int(job)] if dag != "0" else 0.0
        for index in range(2):
            out.append(
                Point(
                    "gpu",
                    {
                        **tags,
                        "index": str(index),
                        "nvml_index": str(2 * worker + index),
                        "uuid": f"SIM-{worker}-{index}",
                        "name": "Simulated GPU",
                    },
                    {
                        "utilization_gpu": util,
                        "memory_used": 1000.0 if dag != "0" else 100.0,
                        "memory_used_percent": 5.0,
                    },
                    T0 + i * STEP,
                )
            )
        out.append(Point("worker", tags, {"tasks": int(dag != "0"), "running": "[]"}, T0 + i * STEP))
    n = 0
    for job, dag, prefix, count, duration, state in TASKS:
        if (worker, job, dag) not in RUNS:
            continue
        for k in range(count):
            end = T0 + (RUNS[worker, job, dag].start + 1 + k) * STEP
            tags = {"host": host, "worker": address, "job": str(job), "prefix": prefix, "state": state}
            fields = {
                "key": f"('{prefix}-abc', {k}, {worker})",
                "start": end / 1e9 - duration,
                "duration": duration,
                "compute": duration * 0.75,
                "transfer": duration * 0.25,
                "disk_read": 0.0,
                "disk_write": 0.0,
                **({"nbytes": 100} if state == "memory" else {}),
            }
            (fields if dag_field else tags)["dag"] = str(dag)
            out.append(Point("task", tags, fields, end + n))
            n += 1
    for job, prefix, activity, unit, values in ACTIVITY:
        for k, value in enumerate(values):
            tags = {
                "host": host,
                "worker": address,
                "job": str(job),
                "prefix": prefix,
                "activity": activity,
                "unit": unit,
            }
            out.append(Point("activity", tags, {"value": value / 2, "jobs": 1}, T0 + (20 + 10 * k) * STEP))
    return out


def dag_points(dag_field: bool = False) -> list[Point]:
    out = []
    for job, dag, start, end in ((1, 1, 5, 15), (1, 2, 10, 20), (2, 3, 25, 35)):
        for event, t, status, fields in (
            ("submit", start, "running", {"tasks": 6, "label": f"client-{job}"}),
            ("end", end, "erred" if dag == 3 else "ok", {"duration": (end - start) / 10}),
        ):
            ids = {"dag": str(dag), "status": status}
            tags = {"host": "node1", "job": str(job), **({} if dag_field else ids)}
            out.append(Point("dag", tags, {"event": event, **fields, **(ids if dag_field else {})}, T0 + t * STEP - 1))
    return out


def all_points(dag_field: bool = False) -> list[Point]:
    return [p for w in range(2) for p in worker_points(w, dag_field)] + dag_points(dag_field)


def write_influxd(influxd, database: str, dag_field: bool = False, points=None) -> None:
    response = influxd.write(lineprotocol.encode_many(points or all_points(dag_field)), db=database)
    response.raise_for_status()


def write_spool(root, dag_field: bool = False, folders=None) -> str:
    """One session folder under ``root`` written by the spool sink, as workers and scheduler do (``folders``:
    ``{folder: points}``, default the points above); returns root."""
    session = os.path.join(os.fspath(root), "20251123T120000-000001")
    folders = folders or {
        "w0": worker_points(0, dag_field),
        "w1": worker_points(1, dag_field),
        "scheduler": dag_points(dag_field),
    }
    for name, points in folders.items():
        sink = SpoolSink(os.path.join(session, name))
        sink.send(lineprotocol.encode_many(points))
        sink.close()
    return os.fspath(root)


# --- per task prefix (tasks.prefix_gpu): GPU readings known sample by sample -------------------
# Every 100 ms (i = 0..9). Workers A and B share GPU-a (A writes its device readings, B only its own
# memory); C's own GPU is GPU-c (its index 1 is GPU-a: dask-cuda's rotated list). Sample i stands for
# the window (i-1, i] (in steps of 100 ms).
PREFIX_WORKERS = {"A": "tcp://127.0.0.1:2001", "B": "tcp://127.0.0.1:2002", "C": "tcp://127.0.0.1:2003"}
GPU_A = {
    "utilization_gpu": [0, 0, 50, 100, 100, 20, 0, 0, 0, 0],
    "sm_active": [0, 0, 20, 85, 85, 10, 0, 0, 0, 0],
    "worker_memory_used": [100, 100, 100, 600, 600, 600, 600, 600, 600, 600],  # A's own, with the device fields
}
B_MEMORY = [0, 0, 0, 0, 0, 0, 0, 1000, 1000, 1000]  # on GPU-a
GPU_C = {"utilization_gpu": [30] * 10, "sm_active": [25] * 10, "worker_memory_used": [50] * 10}
# (worker, job, dag, prefix, start, end) in steps of 100 ms
PREFIX_TASKS = [
    ("A", 1, 1, "mm", 1.5, 4.0),  # half of window 2 (50 %), windows 3, 4 (100 %); memory 100 -> 600
    ("A", 1, 1, "tiny", 4.2, 4.25),  # 5 ms inside window 5: 20 %
    ("A", 1, 1, "mm", 6.0, 8.0),  # windows 7, 8: idle; memory 600 -> 600
    ("A", 1, 3, "late", 9.5, 11.0),  # after the last sample: nothing measured
    ("B", 2, 2, "hold", 4.5, 6.5),  # half of window 5 (20 %), window 6, half of 7 on the shared GPU-a
    ("C", 2, 2, "mm", 2.0, 3.0),  # window 3 of GPU-c: 30 %
]


def prefix_gpu_points() -> list[Point]:
    """The ``gpu`` and ``task`` points above (the hand-computed answers are in tests/test_tasks.py)."""
    host = {"host": "node2"}
    out = []
    for i in range(10):
        t = T0 + i * STEP
        for worker, job, index, uuid, fields in (
            ("A", "1", "0", "GPU-a", GPU_A),
            ("B", "2", "0", "GPU-a", {"worker_memory_used": B_MEMORY}),
            ("C", "2", "0", "GPU-c", GPU_C),
            ("C", "2", "1", "GPU-a", {"worker_memory_used": [7] * 10}),
        ):
            tags = {**host, "worker": PREFIX_WORKERS[worker], "job": job, "dag": job, "index": index, "uuid": uuid}
            out.append(Point("gpu", tags, {f: float(v[i]) for f, v in fields.items()}, t))
    for n, (worker, job, dag, prefix, start, end) in enumerate(PREFIX_TASKS):
        tags = {**host, "worker": PREFIX_WORKERS[worker], "job": str(job), "dag": str(dag), "prefix": prefix}
        fields = {"key": f"{prefix}-{n}", "start": (T0 + start * STEP) / 1e9, "duration": (end - start) * STEP / 1e9}
        out.append(Point("task", {**tags, "state": "memory"}, fields, T0 + round(end * STEP)))
    return out


def flux_answer(points: list[Point]) -> str:
    """InfluxDB 2.x's annotated CSV for a pivoted query of ``points``: one table per tag set, strings as strings."""
    tables: dict[tuple, list[Point]] = {}
    for p in points:
        tables.setdefault(tuple(sorted(p.tags.items())), []).append(p)
    blocks = []
    for number, (tags, group) in enumerate(tables.items()):
        fields = sorted({f for p in group for f in p.fields})
        kinds = ["string" if isinstance(group[0].fields.get(f, ""), str) else "double" for f in fields]
        columns = ["_time"] + [k for k, _ in tags] + fields
        rows = [
            f"#datatype,string,long,dateTime:RFC3339,{','.join(['string'] * len(tags) + kinds)}",
            "#group,false,false,false," + ",".join(["true"] * len(tags) + ["false"] * len(fields)),
            "#default,_result,,," + "," * (len(columns) - 2),
            ",result,table," + ",".join(columns),
        ]
        for p in group:
            seconds, nanos = divmod(p.time_ns, 1_000_000_000)
            when = f"{_utc(seconds)}.{nanos:09d}Z"
            values = [v for _, v in tags] + [_csv(p.fields.get(f, "")) for f in fields]
            rows.append(f",,{number},{when}," + ",".join(values))
        blocks.append("\r\n".join(rows) + "\r\n")
    return "\r\n".join(blocks) + "\r\n"


def _utc(seconds: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _csv(value) -> str:
    text = str(value)
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text
