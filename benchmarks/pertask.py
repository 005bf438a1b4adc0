"""The hooks a worker pays per task, part by part, and their total against issue 46's target (<= 10 us a task).

Standalone (not in ``MODULES``). What the default configuration (``sampler.mode: agent``, every metric, the task
stream and fine metrics on) runs for one task, each part measured alone so that none is counted twice:

1. ``transition()`` on a real worker, on its event loop: a LocalCluster of 1 worker process (1 thread), monitor on
   at 50 ms, worker CPU of one task's 5 transitions (:func:`benchmarks.workerside._per_task_us`: the annotation
   read, ``Publisher.started``/``ended``'s bookkeeping, the wake check and nudge, the task-stream record), batches
   of :data:`EVERY` tasks 50 ms apart (the loop free between them: the deferred write, not counted here, and the
   agent's sample acknowledging it), default vs ``sampler_mode="thread"`` (informational), 3 alternated rounds.
   Its keys are not in the worker's state (no annotation, no startstops to copy): a real task's two dict reads
   more are not in it.
2. The Publisher's deferred writes (event loop): the snapshot written once per agent sample with the tasks since
   (:meth:`~dask_influx_metrics.link.snapshot.Publisher.flush`), a simulated sample (``SnapshotReader.refresh``
   and ``write_beat``, untimed) every :data:`EVERY` tasks, per task; and the bookkeeping alone (already in 1).
3. The fine-metrics tap (event loop): what ``_dask.tap_execute_digests``'s cover adds to Dask's
   ``digest_metric``, per execute digest and per other digest, times those of one task (:data:`DIGESTS`).
4. The task stream (the link's thread, in the worker process): per point, records -> points
   (``TaskStream.points``), line protocol, the write into the outbox the agent sends (ticks of :data:`TICK`
   tasks, as ~200 ms of short tasks); the agent's take of them is in 5, not in the total.
5. The outbox alone, per point: the worker's ``Outbox.send`` of batches of 40 task lines, the agent's
   ``OutboxReader.take`` and ``sent`` (informational).
6. What waking a waiting thread costs the process (informational, :func:`thread_wake`): what the link's
   ``nudge`` cost per task while it woke its thread at every task started on an idle worker (on a 1-thread
   worker running short tasks: every task); it now wakes it only after an idle while.

``--before REF``: 2-4 also for ``git archive REF``'s package, imported in this process under another name, rounds
alternated with this checkout's (the cluster's part is this checkout's only).

Run: ``PYTHONPATH=$PWD .venv/bin/python -m benchmarks.pertask [--no-cluster] [--before REF]``. Medians of thread
CPU; the total (1 + 2 + 3 + 4) needs the cluster's figure.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
import time

from benchmarks import common, receivers

EVERY = 50  # tasks between two agent samples (1 ms tasks at 50 ms)
TICK = 200  # tasks per task-stream write (the link's thread writes every 200 ms)
ROUNDS = 7
KEY = ("bench-0123456789abcdef", 0)
# digests Dask adds per task: 4 execute ones (thread-cpu, thread-noncpu, executor, other) and 2 others (get-data
# when its result is fetched), counted on distributed 2026.8 for 500 tasks gathered from a 1-thread LocalCluster
DIGESTS = {"execute": 4, "other": 2}
TARGET_US = 10.0
NOW = "dask_influx_metrics"
BEFORE = "dim_before"  # the name --before's package is imported under


def _module(package: str, name: str):
    return importlib.import_module(f"{package}.{name}")


def publisher(package: str = NOW, n: int = 20_000) -> dict:
    """One round: us per task of the deferred writes, and of ``started`` + ``ended`` (the bookkeeping)."""
    seqlock, snapshot = _module(package, "link.seqlock"), _module(package, "link.snapshot")
    buf = seqlock.SnapshotBuffer.create(snapshot.BUFFER_BYTES)
    beat = seqlock.SnapshotBuffer.create(snapshot.BEAT_BYTES)
    try:
        pub = snapshot.Publisher(buf, snapshot.BeatReader(beat, "w").acked, nthreads=1)
        due = []
        pub.defer = due.append  # beside the agent: a change written just before its next sample
        reader = snapshot.SnapshotReader(buf)
        books = writes = 0
        for i in range(n):
            if i % EVERY == 0:  # the deferred write, then the agent's sample acknowledging it
                t = time.thread_time_ns()
                for flush in due:
                    flush()
                writes += time.thread_time_ns() - t
                due.clear()
                reader.refresh()
                snapshot.write_beat(beat, 1, i, 0, json.dumps({"acked": {"w": reader.acked}}).encode())
            key = (KEY[0], i)
            t = time.thread_time_ns()
            pub.started(key, 1, 3)
            pub.ended(key)
            books += time.thread_time_ns() - t
        return {"writes": writes / n / 1000, "bookkeeping": books / n / 1000}
    finally:
        buf.close()
        beat.close()


def tap(package: str = NOW, n: int = 100_000) -> dict:
    """One round: us the tap adds per execute digest and per other digest (a stub worker's ``digest_metric``)."""
    dask = _module(package, "_dask")

    class Worker:
        def digest_metric(self, name, value):
            pass

    names = {"execute": ("execute", "span-id", "inc", "thread-cpu", "seconds"), "other": ("get-data", "network")}
    worker, got = Worker(), []

    def calls(name) -> float:
        call = worker.digest_metric
        t = time.thread_time_ns()
        for _ in range(n):
            call(name, 1.0)
        return (time.thread_time_ns() - t) / n / 1000

    out = {}
    for kind, name in names.items():
        bare = calls(name)
        undo = dask.tap_execute_digests(worker, got.append)
        out[kind] = calls(name) - bare
        undo()
        got.clear()
    return {**out, "per task": sum(out[k] * DIGESTS[k] for k in DIGESTS)}


def stream(package: str = NOW, n: int = 20_000) -> dict:
    """One round: us per point of records -> points, line protocol and the outbox write (records -> lines, and
    no encoder, where the task stream writes its lines itself: ``TaskStream.lines``)."""
    lineprotocol, outbox_ = _module(package, "lineprotocol"), _module(package, "link.outbox")
    fields = frozenset(_module(package, "schema").TRACKING["task-stream"])
    out = {"points": 0, "encode": 0, "write": 0}
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        box, reader = outbox_.Outbox(folder, "w"), outbox_.OutboxReader(folder, "w")
        ts = _module(package, "worker.taskstream").TaskStream(fields, common.TAGS)
        for tick in range(0, n, TICK):
            for i in range(tick, tick + TICK):  # 1 ms tasks, their ends as Dask leaves them
                t = 1.7e9 + i * 1e-3
                compute = {"action": "compute", "start": t, "stop": t + 0.0008}
                ts.ended.append(((KEY[0], i), 1, 3, ("memory", "bench", (compute,), 28), t + 0.0009))
            t0 = time.thread_time_ns()
            if hasattr(ts, "lines"):  # the task stream writes its lines itself (no points, no encoder)
                lines = ts.lines(now_ns=0)
                t1 = t2 = time.thread_time_ns()
            else:
                points = ts.points(now_ns=0)
                t1 = time.thread_time_ns()
                lines = lineprotocol.encode_many(points)
                t2 = time.thread_time_ns()
            box.send(lines)
            t3 = time.thread_time_ns()
            reader.take()  # the agent's, untimed
            reader.sent()
            for k, a, b in (("points", t0, t1), ("encode", t1, t2), ("write", t2, t3)):
                out[k] += b - a
        box.close()
    finally:
        shutil.rmtree(folder)
    out = {k: v / n / 1000 for k, v in out.items()}
    return {**out, "total": sum(out.values())}


def outbox(n: int = 20_000, batch: int = 40, rounds: int = 5) -> dict:
    from dask_influx_metrics.link.outbox import Outbox, OutboxReader

    line = b'task,host=h,worker=tcp://127.0.0.1:40000,job=1,dag=1,session=s key="%d",duration=0.01 %d'
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


def thread_wake(n: int = 5_000, rounds: int = 9) -> dict:
    """Process CPU us per turn of a loop doing ~10 us of work and a poll (the GIL released, as the event loop's),
    with and without setting an Event another thread waits on (it wakes, clears it, waits again)."""
    import select
    import threading

    event, stop = threading.Event(), threading.Event()

    def waiter():
        while not stop.is_set():
            event.wait(1.0)
            event.clear()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    r, w = os.pipe()

    def turns(wake: bool) -> float:
        t = time.process_time_ns()
        for _ in range(n):
            sum(range(300))  # the task's own work on the loop
            if wake and not event.is_set():
                event.set()
            select.select([r], [], [], 0)
        return (time.process_time_ns() - t) / n / 1000

    try:
        runs = common.alternate({"wake": lambda: turns(True), "none": lambda: turns(False)}, rounds)
    finally:
        stop.set()
        event.set()
        thread.join()
        os.close(r)
        os.close(w)
    return {k: common.median(v) for k, v in runs.items()}


def transitions(rounds: int = 3) -> dict:
    from distributed import Client, LocalCluster

    from benchmarks.workerside import _per_task_us
    from dask_influx_metrics import Monitor

    variants = {"default (agent)": {}, "sampler_mode=thread": {"sampler_mode": "thread"}}
    with (
        receivers.Drain() as rx,
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):

        def one(settings):
            m = Monitor(client, sink="udp", telegraf_address="%s:%d" % tuple(rx.address), **common.gpu_settings(1))
            m.attach(polling_interval=50, **settings)
            m.start()
            try:
                # EVERY tasks per agent sample, as the Publisher's part: 1 ms tasks at 50 ms
                return next(iter(client.run(_per_task_us, size=EVERY, pause=0.05).values()))
            finally:
                m.shutdown()

        runs = common.alternate({k: (lambda s=s: one(s)) for k, s in variants.items()}, rounds)
    return {k: (common.median(v), v) for k, v in runs.items()}


def alternated(packages: list[str], rounds: int = ROUNDS) -> dict:
    """{package: {part: {figure: median}}} of :func:`publisher`, :func:`tap` and :func:`stream`, each package's
    round beside the other's, their order swapped every round."""
    parts = {"publisher": publisher, "tap": tap, "stream": stream}
    runs = {p: {name: [] for name in parts} for p in packages}
    for r in range(rounds):
        for package in packages if r % 2 == 0 else packages[::-1]:
            for name, fn in parts.items():
                runs[package][name].append(fn(package))
    return {
        p: {name: {k: common.median([run[k] for run in rs]) for k in rs[0]} for name, rs in by.items()}
        for p, by in runs.items()
    }


def _hooks(m: dict, transition: float | None) -> dict:
    """{hook: (us a task, where it runs)}: the parts of the total."""
    pub, digests, s = m["publisher"], m["tap"], m["stream"]
    parts = {
        "Publisher's deferred writes": (pub["writes"], "event loop"),
        "fine-metrics tap (%d execute + %d other digests)" % (DIGESTS["execute"], DIGESTS["other"]): (
            digests["per task"],
            "event loop",
        ),
        "task stream point (records -> lines + outbox write)": (s["total"], "link thread"),
    }
    if transition is not None:
        parts = {"transition() x5 (bookkeeping, wake, nudge, record)": (transition, "event loop"), **parts}
    return parts


def main() -> None:
    before = sys.argv[sys.argv.index("--before") + 1] if "--before" in sys.argv else None
    folder = None
    if before is not None:
        folder, _ = common.package_at(before, BEFORE)
        sys.path.insert(0, folder)
    try:
        figures = alternated([NOW] + ([BEFORE] if before else []))
    finally:
        if folder is not None:
            sys.path.remove(folder)
            shutil.rmtree(folder, ignore_errors=True)
    o, wake = outbox(), thread_wake()
    labels = {NOW: "this checkout", BEFORE: f"before ({before})"}
    for package, m in figures.items():
        pub, digests, s = m["publisher"], m["tap"], m["stream"]
        print(f"-- {labels[package]}")
        print(
            "Publisher, us per task: deferred writes (one per %d tasks) %.2f; started+ended bookkeeping %.2f (in "
            "transition())" % (EVERY, pub["writes"], pub["bookkeeping"])
        )
        print("tap, us added per digest: execute %.3f, other %.3f" % (digests["execute"], digests["other"]))
        print(
            "task stream, us per point: points (or lines) %.2f, encode %.2f, outbox write %.2f (ticks of %d)"
            % (s["points"], s["encode"], s["write"], TICK)
        )
    print(
        "outbox, us per point (batches of 40): worker write %.2f, agent take+sent %.2f" % (o["write"], o["take+sent"])
    )
    print(
        "a thread wake, process CPU: %.2f us (a loop turn %.2f us with one, %.2f without)"
        % (wake["wake"] - wake["none"], wake["wake"], wake["none"])
    )
    transition = None
    if "--no-cluster" not in sys.argv:
        runs = transitions()
        for k, (med, rs) in runs.items():
            print(
                "transition() on a worker, %s: %.2f us per task (5 transitions) [runs %s]"
                % (k, med, ", ".join("%.2f" % x for x in rs))
            )
        transition = runs["default (agent)"][0]
    hooks = {p: _hooks(m, transition if p == NOW else None) for p, m in figures.items()}
    print()
    print("%-58s %s  runs on" % ("hook, default configuration, us a task", "".join("%18s" % labels[p] for p in hooks)))
    for what, (_, where) in hooks[NOW].items():
        cells = "".join("%18.2f" % hooks[p][what][0] if what in hooks[p] else "%18s" % "-" for p in hooks)
        print("%-58s %s  %s" % (what, cells, where))
    beside = {p: sum(us for what, (us, _) in h.items() if not what.startswith("transition")) for p, h in hooks.items()}
    print("%-58s %s" % ("the hooks beside transition()", "".join("%18.2f" % t for t in beside.values())))
    if transition is not None:
        total = transition + beside[NOW]
        met = "met" if total <= TARGET_US else "NOT met"
        print("%-58s %18.2f  target <= %.0f us: %s" % ("total", total, TARGET_US, met))


if __name__ == "__main__":
    main()
