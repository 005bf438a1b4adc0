"""Issue 43's fault scenarios on a real LocalCluster (2 workers x 2 threads, task stream on): each a function that
returns its figures; ``tests/test_faults.py`` runs them scaled down, and this file runs them full size::

    unshare -m --propagation private sh -c 'mount -t tmpfs -o size=2m tmpfs /tmp/shm && \\
        mount -t tmpfs -o size=8m tmpfs /tmp/spool && .venv/bin/python tests/faults.py shm --full \\
        --run /tmp/shm --spool /tmp/spool'
    .venv/bin/python tests/faults.py agent-kill --full     # also worker-kill, influx-down

``shm`` needs its small run folder mounted already (``--run``: a tmpfs of 2 MiB; ``--spool``: a second one for
the spool, filled too in a third phase); the HTTP ones start their own ``influxd`` behind :class:`Proxy`, which
counts every task line posted (doubles) and can go down (connections refused, as a stopped server).
"""

from __future__ import annotations

import argparse
import errno
import http.server
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter

import requests

POLL_MS = 100
TRACKING = ["task-stream", "tasks"]


def work(i: int, seconds: float = 0.001, log: str | None = None):
    """A task: a short wait; returns (pid, end time); with ``log``, its end also appended there (a worker killed
    before its result reached the scheduler still leaves it)."""
    threading.Event().wait(seconds)
    end = time.time()
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {end!r} {i}\n")
    return os.getpid(), end


def key(i: int) -> str:
    return f"fault-{i:06d}"


class Feeder(threading.Thread):
    """Submits ``rate`` tasks a second (in batches every 50 ms) until ``total`` are in; ``futures`` keeps them."""

    def __init__(self, client, total: int, rate: float, workers=None, log=None, seconds: float = 0.001):
        super().__init__(daemon=True)
        self.client, self.total, self.rate, self.workers, self.log = client, total, rate, workers, log
        self.seconds = seconds
        self.futures, self.done = [], threading.Event()

    def run(self):
        start, i = time.monotonic(), 0
        while i < self.total:
            due = min(self.total, int((time.monotonic() - start) * self.rate) + 1)
            if due > i:
                keys = [key(n) for n in range(i, due)]
                self.futures += self.client.map(
                    work, range(i, due), key=keys, workers=self.workers, log=self.log, seconds=self.seconds
                )
                i = due
            time.sleep(0.05)
        self.done.set()


class Watch(threading.Thread):
    """Every 0.1 s: the workers' and their agents' pids, and the run folder's file system use."""

    def __init__(self, client, run=None):
        super().__init__(daemon=True)
        self.client, self.run_dir, self.stop = client, run, threading.Event()
        self.workers, self.agents, self.max_used, self.full_samples, self.samples = set(), set(), 0, 0, 0

    def run(self):
        while not self.stop.wait(0.1):
            try:
                found = self.client.run(_pids, on_error="return")
            except Exception:
                continue
            for got in found.values():
                if isinstance(got, tuple):
                    self.workers.add(got[0])
                    if got[1]:
                        self.agents.add(got[1])
            if self.run_dir:
                st = os.statvfs(self.run_dir)
                used = (st.f_blocks - st.f_bfree) * st.f_frsize
                self.max_used = max(self.max_used, used)
                self.full_samples += st.f_bavail * st.f_frsize < 64 << 10
                self.samples += 1


def _pids(dask_worker):
    plugin = dask_worker.plugins.get("influx-metrics")
    link = plugin.link if plugin is not None else None
    beat = link.beat() if link else None
    return os.getpid(), beat["pid"] if beat else None


def agent_pid(client) -> int:
    (pid,) = {a for _, a in client.run(_pids).values() if a}
    return pid


def fill(folder: str) -> str:
    """Fill ``folder``'s file system to the last byte; the file to remove to free it."""
    path = os.path.join(folder, "fill")
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return path


def outbox_counts(monitor) -> dict:
    """The workers' outbox counters, summed (``Monitor.delivery()``)."""
    total = Counter()
    for counters in monitor.delivery().values():
        for c in counters:
            if c.get("kind") == "outbox":
                total.update({k: v for k, v in c.items() if k != "kind"})
    return dict(total)


def events(client, what: str, since: float) -> list[dict]:
    return [e for t, e in client.get_events("influx-metrics") if e.get("what") == what and t >= since]


def spool_task_points(folder: str) -> tuple[dict, int]:
    """``{key: [point, ...]}`` of the task points under a spool folder, and how many lines did not parse."""
    from dask_influx_metrics.client.query.spool import read_points

    points, skipped, _ = read_points(folder)
    out: dict = {}
    for p in points:
        if p.measurement == "task":
            out.setdefault(p.fields["key"], []).append(p)
    return out, len(skipped)


def _cluster():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None)
    return cluster, Client(cluster)


# --- the run folder's file system full ---------------------------------------------------------------------------
def shm(client, run: str, spool: str | None = None, alone: float = 2.0, hold: float = 2.0, rate: float = 400.0):
    """Tasks at ``rate``/s on a run folder (``run``: a 2 MiB tmpfs): ``alone`` s with nothing else in it (does the
    monitor fill it?), then filled for ``hold`` s (the agent SIGKILLed meanwhile: its successor starts on a full
    folder; the outboxes have the disk), freed; with ``spool`` (a second small tmpfs, the spool's, so also the
    outboxes' way out) that one filled for ``hold`` s (the task points wait in the outboxes), then both; 2 s
    more. Losses by when their tasks ended."""
    from dask_influx_metrics import Monitor

    spool_dir = spool or tempfile.mkdtemp(prefix="faults-spool-")
    monitor = Monitor(client, sink="spool", spool_directory=spool_dir, run_directory=run, flush_interval=0.2)
    monitor.attach(polling_interval=POLL_MS, tracking=TRACKING)
    since = time.time()
    session = monitor.start()
    watch = Watch(client, run)
    watch.start()
    feeder = Feeder(client, total=int(rate * (alone + (hold + 1.0) * (3 if spool else 1) + 2.0)), rate=rate)
    feeder.start()
    time.sleep(alone)
    alone_max, alone_full = watch.max_used, watch.full_samples
    windows = {}
    for name, folders in [("run", [run])] + ([("spool", [spool]), ("both", [run, spool])] if spool else []):
        agent = agent_pid(client)
        start = time.time()
        fills = [fill(f) for f in folders]
        if name == "run":
            time.sleep(min(1.0, hold / 3))
            os.kill(agent, signal.SIGKILL)
        time.sleep(max(0.0, hold - (time.time() - start)))
        for path in fills:
            os.unlink(path)
        windows[name] = (start, time.time())
        time.sleep(1.0)
    feeder.join()
    ends = dict(zip((f.key for f in feeder.futures), (end for _, end in client.gather(feeder.futures))))
    time.sleep(1.0)  # the last task points written and taken
    counts = outbox_counts(monitor)
    monitor.stop()
    watch.stop.set()
    watch.join()
    got, garbled = spool_task_points(os.path.join(spool_dir, session["id"]))
    lost = sorted(k for k in ends if k not in got)

    def within(k, name):
        return name in windows and windows[name][0] - 0.5 <= ends[k] <= windows[name][1] + 0.5

    freed = max(end for _, end in windows.values())
    return {
        "scenario": "shm",
        "alone": {"seconds": alone, "max_used": alone_max, "samples_full": alone_full},
        "hold_s": hold,
        "tasks": len(ends),
        "task_points": sum(len(v) for k, v in got.items() if k in ends),
        "doubled": sum(len(v) - 1 for v in got.values() if len(v) > 1),
        "lost": len(lost),
        "lost_while_run_full": sum(within(k, "run") for k in lost),
        "lost_while_spool_full": sum(within(k, "spool") for k in lost),
        "lost_while_both_full": sum(within(k, "both") for k in lost),
        "after_freeing": {
            "tasks": sum(1 for e in ends.values() if e > freed + 1.0),
            "lost": sum(1 for k in lost if ends[k] > freed + 1.0),
        },
        "counted_lost": counts.get("points_dropped", 0),
        "reported_lost": sum(e.get("points", 0) for e in events(client, "outbox-lost", since)),
        "spilled": counts.get("points_spilled", 0),
        "moved_events": [e["message"] for e in events(client, "outbox", since)],
        "garbled_lines": garbled,
        "workers_seen": len(watch.workers),
        "agents_seen": len(watch.agents),
        "agents_killed_by_us": 1,
        "run_size": os.statvfs(run).f_blocks * os.statvfs(run).f_frsize,
        "run_max_used": watch.max_used,
        "run_folder_said": [e["message"] for e in events(client, "run-folder", since)],
    }


# --- HTTP: a proxy in front of influxd ------------------------------------------------------------------------
_KEY = re.compile(rb'key="((?:[^"\\]|\\.)*)"')


class Switchable:
    """An HTTP server on 127.0.0.1 whose ``post(path, body) -> (status, content)`` answers each POST; it can go
    down (connections refused, as a stopped server) and come back on the same port."""

    def __init__(self):
        outer, self.port = self, None

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                status, content = outer.post(self.path, self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args):
                pass

        self._handler = Handler
        self.up()

    def up(self):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port or 0), self._handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"


class Proxy(Switchable):
    """In front of influxd: forwards every write and counts the task lines posted per key (``posted``)."""

    def __init__(self, target: str):
        self.target, self.posted, self._lock = target, Counter(), threading.Lock()
        super().__init__()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        r = requests.post(self.target + path, data=body, timeout=30)
        if r.status_code < 300:
            tasks = [line for line in body.split(b"\n") if line.startswith(b"task,")]
            with self._lock:
                self.posted.update(m.group(1) for m in map(_KEY.search, tasks) if m)
        return r.status_code, r.content


def _influx_count(influxd, db: str, distinct: bool = True) -> int:
    """The tasks with a point in InfluxDB (``distinct``), or its task points (a task written twice as two
    points would count twice; the same point posted twice is one)."""
    field = 'distinct("key")' if distinct else '"key"'
    rows = influxd.query(f'SELECT count({field}) FROM "task"', db=db)
    return rows[0]["count"] if rows else 0


def _http_monitor(client, proxy, db, spool_dir, polling=POLL_MS, **options):
    from dask_influx_metrics import Monitor

    monitor = Monitor(
        client,
        sink="http",
        influxdb_url=proxy.url,
        database=db,
        spool_directory=spool_dir,
        flush_interval=0.2,
        **options,
    )
    monitor.attach(polling_interval=polling, tracking=TRACKING)
    return monitor, monitor.start()


def stop_monitor(client, monitor) -> None:
    """``monitor.stop()``, then until the host's agent has exited (it closes its sink after the workers left:
    what is still undelivered is counted after that)."""
    pid = agent_pid(client)
    monitor.stop()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def agent_kill(client, influxd, db: str, tasks: int = 20_000, kills: int = 3, batch: int = 250) -> dict:
    """A backlog of ``tasks`` tasks (all submitted at once), the http sink (``batch`` lines a post), the agent
    SIGKILLed ``kills`` times while their points go out; then the counts in InfluxDB and how often the proxy saw
    each task line (a kill while a post is in flight, after InfluxDB has its lines, posts that file again)."""
    proxy = Proxy(influxd.url)
    spool_dir = tempfile.mkdtemp(prefix="faults-spool-")
    try:
        since = time.time()
        monitor, session = _http_monitor(client, proxy, db, spool_dir, batch_size=batch)
        futures = client.map(work, range(tasks), key=[key(i) for i in range(tasks)], seconds=0.0)
        killed = []
        for _ in range(kills):
            time.sleep(1.0)
            killed.append(agent_pid(client))
            os.kill(killed[-1], signal.SIGKILL)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and {a for _, a in client.run(_pids).values()} & {None, *killed}:
                time.sleep(0.05)
        client.gather(futures)
        finished = time.monotonic()
        while _influx_count(influxd, db) < tasks and time.monotonic() - finished < 120:
            time.sleep(0.5)
        in_influx_after = time.monotonic() - finished
        stop_monitor(client, monitor)
        return {
            "scenario": "agent-kill",
            "tasks": tasks,
            "kills": len(killed),
            "in_influxdb": _influx_count(influxd, db),
            "points_in_influxdb": _influx_count(influxd, db, distinct=False),
            "seconds_after_the_last_task": round(in_influx_after, 1),
            "posted_twice_or_more": sum(1 for k, n in proxy.posted.items() if k.startswith(b"fault-") and n > 1),
            "replay_events": _replay_events(client, since),
            "left_undelivered": _undelivered(os.path.join(spool_dir, session["id"])),
        }
    finally:
        proxy.down()


def influx_down(client, influxd, db: str, tasks: int = 7250, down: float = 30.0, rate: float = 145.0) -> dict:
    """Tasks at ``rate``/s, ``tasks`` in all; InfluxDB (its proxy) down for ``down`` s in the middle; how long after
    its return every task point is in it, without any command."""
    proxy = Proxy(influxd.url)
    spool_dir = tempfile.mkdtemp(prefix="faults-spool-")
    try:
        since = time.time()
        monitor, session = _http_monitor(client, proxy, db, spool_dir)
        feeder = Feeder(client, total=tasks, rate=rate)
        feeder.start()
        time.sleep(max(1.0, (tasks / rate - down) / 2))
        proxy.down()
        time.sleep(down)
        kept = _undelivered(os.path.join(spool_dir, session["id"]))
        proxy.up()
        back = time.monotonic()
        feeder.join()
        client.gather(feeder.futures)
        while _influx_count(influxd, db) < tasks and time.monotonic() - back < 120:
            time.sleep(0.25)
        complete_after = time.monotonic() - back
        said = _replay_events(client, since)
        stop_monitor(client, monitor)
        return {
            "scenario": "influx-down",
            "tasks": tasks,
            "down_s": down,
            "undelivered_lines_while_down": kept,
            "in_influxdb": _influx_count(influxd, db),
            "all_in_s_after_return": round(complete_after, 1),
            "posted_twice_or_more": sum(1 for k, n in proxy.posted.items() if k.startswith(b"fault-") and n > 1),
            "replay_events": said,
            "left_undelivered": _undelivered(os.path.join(spool_dir, session["id"])),
        }
    finally:
        proxy.down()


def _replay_events(client, since: float) -> list[str]:
    return [
        e["what"]
        for t, e in client.get_events("influx-metrics")
        if t >= since and e.get("what", "").startswith("http-replay")
    ]


def _undelivered(folder: str) -> int:
    from dask_influx_metrics.sinks.paths import UNDELIVERED_DIR
    from dask_influx_metrics.sinks.spool import read_lines

    return sum(
        sum(1 for _ in read_lines(os.path.join(root, d)))
        for root, dirs, _ in os.walk(folder)
        for d in dirs
        if d == UNDELIVERED_DIR
    )


# --- a worker killed ---------------------------------------------------------------------------------------------
def worker_kill(client, polling: int = 2000, seconds: float = 3.0, rate: float = 300.0) -> dict:
    """Tasks at ``rate``/s on one worker, which is SIGKILLed after ``seconds``, 10 ms before it would write its task
    points (the worst moment); which of its finished tasks have no point, and when they ended (each task notes its
    end in a file as it returns)."""
    from dask_influx_metrics import Monitor

    spool_dir = tempfile.mkdtemp(prefix="faults-spool-")
    log = os.path.join(spool_dir, "ends.txt")
    monitor = Monitor(client, sink="spool", spool_directory=spool_dir, flush_interval=0.2)
    monitor.attach(polling_interval=polling, tracking=TRACKING)
    session = monitor.start()
    (victim, (victim_pid, _)) = next(iter(client.run(_pids).items()))
    # tasks of 10 ms, more than its 2 threads run: never idle, so it writes every 200 ms, not when work comes
    feeder = Feeder(client, total=int(rate * (seconds + 2)), rate=rate, workers=[victim], log=log, seconds=0.01)
    feeder.start()
    time.sleep(seconds)
    # the worst moment: just before the worker's next write of its task points (one clock for every process)
    due = client.run(lambda dask_worker: dask_worker.plugins["influx-metrics"].link._due, workers=[victim])[victim]
    time.sleep(max(0.0, due - 0.01 - time.monotonic()))
    killed_at = time.time()
    os.kill(victim_pid, signal.SIGKILL)
    time.sleep(3 * polling / 1000 + 2.0)  # the agent sees it dead and sends its outbox
    monitor.stop()
    ended = {}
    with open(log) as f:
        for line in f:
            pid, end, i = line.split()
            if int(pid) == victim_pid:
                ended[key(int(i))] = float(end)
    got, garbled = spool_task_points(os.path.join(spool_dir, session["id"]))
    # the victim's points from before the kill (its restart may get the same address and run those keys again)
    sent = {k for k, ps in got.items() if any(p.tags["worker"] == victim and p.time_ns <= killed_at * 1e9 for p in ps)}
    lost = [k for k in ended if k not in sent]
    return {
        "scenario": "worker-kill",
        "polling_ms": polling,
        "victim_tasks_ended": len(ended),
        "lost": len(lost),
        "ended_in_its_last_250_ms": sum(1 for e in ended.values() if e >= killed_at - 0.25),
        "oldest_lost_ended_s_before_kill": round(max((killed_at - ended[k] for k in lost), default=0.0), 3),
        "garbled_lines": garbled,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=["shm", "agent-kill", "influx-down", "worker-kill"])
    parser.add_argument("--run", help="shm: the run folder's tmpfs (2 MiB)")
    parser.add_argument("--spool", help="shm: a second tmpfs for the spool, filled too")
    parser.add_argument("--full", action="store_true", help="the issue's sizes (else the CI's)")
    args = parser.parse_args(argv)
    full, (cluster, client) = args.full, _cluster()
    try:
        if args.scenario == "shm":
            out = shm(client, args.run, args.spool, **({"alone": 25.0, "hold": 10.0} if full else {}))
        elif args.scenario == "worker-kill":
            out = worker_kill(client)
        else:
            from dask_influx_metrics.demo import localinflux

            influxd = localinflux.start()
            try:
                db = influxd.create_database("faults")
                if args.scenario == "agent-kill":
                    out = agent_kill(client, influxd, db, tasks=20_000 if full else 2_000)
                else:
                    out = influx_down(
                        client, influxd, db, **({} if full else {"tasks": 1000, "down": 5.0, "rate": 100.0})
                    )
            finally:
                influxd.stop()
    finally:
        client.close()
        cluster.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the workers import this module's tasks
    sys.exit(main())
