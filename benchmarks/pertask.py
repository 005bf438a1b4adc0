"""Micro-measurements of the worker's per-task costs (issue 14); a standalone script, not in ``MODULES``.

1. ``Publisher.started`` + ``ended`` (shared memory, what the default configuration adds to
   ``transition``): thread CPU per task, tasks one after another as on a 1-thread worker, a
   simulated agent sample (``SnapshotReader.refresh`` and ``write_beat``, untimed) every ``EVERY``
   tasks; and its parts alone: one ``publish``, one beat read (``BeatReader``), one ``acked()``.
2. ``transition()`` on a real worker: a LocalCluster of 1 worker process (1 thread), monitor on at
   50 ms, default (agent) vs ``sampler_mode="thread"``, worker CPU of one task's 5 transitions
   (:func:`benchmarks.workerside._per_task_us`), 3 alternated rounds.
3. The task stream on its sampler thread, per point: records -> points (``TaskStream.points``),
   line protocol, UDP send.
4. The outbox, per point: the worker's ``Outbox.send`` of a batch of task lines (what it writes every
   200 ms), the agent's ``OutboxReader.take`` and ``sent`` at each sample (a sink that took them all),
   in a temporary folder of ``/dev/shm`` (where the run folder is).

Run: ``PYTHONPATH=$PWD .venv/bin/python -m benchmarks.pertask [--no-cluster]``. Medians; thread CPU.
"""

from __future__ import annotations

import json
import sys
import time

from benchmarks import common

EVERY = 50  # tasks between two simulated agent samples
KEY = ("bench-0123456789abcdef", 0)


def publisher(n: int = 20_000, rounds: int = 7) -> dict:
    from dask_influx_metrics.link.seqlock import SnapshotBuffer
    from dask_influx_metrics.link.snapshot import (
        BEAT_BYTES,
        BUFFER_BYTES,
        BeatReader,
        Publisher,
        SnapshotReader,
        write_beat,
    )

    buf, beat = SnapshotBuffer.create(BUFFER_BYTES), SnapshotBuffer.create(BEAT_BYTES)
    try:
        beat_reader = BeatReader(beat, "w")
        pub = Publisher(buf, beat_reader.acked, nthreads=1)
        reader = SnapshotReader(buf)
        per_task = []
        for r in range(rounds):
            spent = 0
            for i in range(n):
                if i % EVERY == 0:  # the agent's sample: the snapshot, then the beat acknowledging it
                    reader.refresh()
                    write_beat(beat, 1, r * n + i, 0, json.dumps({"acked": {"w": reader.acked}}).encode())
                key = (KEY[0], r * n + i)
                t = time.thread_time_ns()
                pub.started(key, 1, 3)
                pub.ended(key)
                spent += time.thread_time_ns() - t
            per_task.append(spent / n / 1000)
        return {
            "started+ended": common.median(per_task),
            "publish": common.cpu_us(pub.publish, 20_000),
            "read_beat": common.cpu_us(lambda: BeatReader(beat, "w")(), 20_000),
            "acked()": common.cpu_us(pub.acked, 20_000),
            "runs": per_task,
        }
    finally:
        buf.close()
        beat.close()


def transitions(rounds: int = 3) -> dict:
    from distributed import Client, LocalCluster

    from benchmarks.workerside import _per_task_us
    from dask_influx_metrics import Monitor

    variants = {"default (agent)": {}, "sampler_mode=thread": {"sampler_mode": "thread"}}
    with (
        common.Drain() as rx,
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):

        def one(settings):
            m = Monitor(client, sink="udp", telegraf_address="%s:%d" % tuple(rx.address), **common.gpu_settings(1))
            m.attach(polling_interval=50, **settings)
            m.start()
            try:
                return next(iter(client.run(_per_task_us).values()))
            finally:
                m.shutdown()

        runs = common.alternate({k: (lambda s=s: one(s)) for k, s in variants.items()}, rounds)
    return {k: (common.median(v), v) for k, v in runs.items()}


def stream(n: int = 20_000, rounds: int = 5) -> dict:
    from dask_influx_metrics import lineprotocol
    from dask_influx_metrics.schema import TRACKING
    from dask_influx_metrics.sinks.udp import UdpSink
    from dask_influx_metrics.worker.taskstream import TaskStream

    compute = {"action": "compute", "start": 1.7e9, "stop": 1.7e9 + 0.01}
    out = {"points": [], "encode": [], "send": []}
    with common.Drain() as rx:
        sink = UdpSink(tuple(rx.address))
        for _ in range(rounds):
            ts = TaskStream(frozenset(TRACKING["task-stream"]), common.TAGS)
            for i in range(n):
                ts.ended.append(((KEY[0], i), 1, 3, ("memory", "bench", (compute,), 28), 1.7e9 + i * 1e-6))
            t0 = time.thread_time_ns()
            points = ts.points(now_ns=0)
            t1 = time.thread_time_ns()
            lines = lineprotocol.encode_many(points)
            t2 = time.thread_time_ns()
            sink.send(lines)
            t3 = time.thread_time_ns()
            for k, a, b in (("points", t0, t1), ("encode", t1, t2), ("send", t2, t3)):
                out[k].append((b - a) / n / 1000)
        sink.close()
    return {k: common.median(v) for k, v in out.items()}


def outbox(n: int = 20_000, batch: int = 40, rounds: int = 5) -> dict:
    import os
    import shutil
    import tempfile

    from dask_influx_metrics.link.outbox import Outbox, OutboxReader

    line = b"task,host=h,worker=tcp://127.0.0.1:40000,job=1,dag=1,session=s key=\"%d\",duration=0.01 %d"
    lines = [line % (i, 1_700_000_000_000_000_000 + i) for i in range(n)]
    out = {"write": [], "take+sent": []}
    for _ in range(rounds):
        folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            box, reader = Outbox(folder, "w"), OutboxReader(folder, "w")
            write = take = 0
            for i in range(0, n, batch):
                t0 = time.thread_time_ns()
                box.send(lines[i : i + batch])
                t1 = time.thread_time_ns()
                reader.take()
                reader.sent()
                t2 = time.thread_time_ns()
                write, take = write + t1 - t0, take + t2 - t1
            out["write"].append(write / n / 1000)
            out["take+sent"].append(take / n / 1000)
            box.close()
        finally:
            shutil.rmtree(folder)
    return {k: common.median(v) for k, v in out.items()}


def main() -> None:
    pub = publisher()
    print(
        "Publisher, us per task (started+ended): %.2f  [runs %s]"
        % (pub["started+ended"], ", ".join("%.2f" % x for x in pub["runs"]))
    )
    print(
        "  one publish %.2f us, one read_beat %.2f us, one acked() %.2f us"
        % (pub["publish"], pub["read_beat"], pub["acked()"])
    )
    s = stream()
    print(
        "task stream, us per point: points %.2f, encode %.2f, send %.2f, total %.2f"
        % (s["points"], s["encode"], s["send"], sum(s.values()))
    )
    o = outbox()
    print(
        "outbox, us per point (batches of 40): worker write %.2f, agent take+sent %.2f" % (o["write"], o["take+sent"])
    )
    if "--no-cluster" not in sys.argv:
        for k, (med, runs) in transitions().items():
            print(
                "transition() on a worker, %s: %.2f us per task (5 transitions) [runs %s]"
                % (k, med, ", ".join("%.2f" % x for x in runs))
            )


if __name__ == "__main__":
    main()
