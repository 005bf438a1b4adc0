"""Isolated sampling (``isolate=True``, the default): the sidecar process (wake, last sample,
heartbeat), and a real LocalCluster sampled by sidecars (tags, the worker's own rss, lifetime,
fallback). The shared memory itself: ``test_shared.py``."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from distributed import Client

from dask_influx_metrics import Monitor, custom_metric, lineprotocol
from dask_influx_metrics.config import Settings
from dask_influx_metrics.worker.sidecar import Sidecar
from dask_influx_metrics.sinks.spool import read_lines
from dask_influx_metrics.worker.sources.activity import TaskRegistry
from dask_influx_metrics.worker.sources.simulated import simulated_uuid

POLL_MS = 50


def wait_until(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout} s")
        time.sleep(0.05)


def points(directory, measurement=None):
    out = [lineprotocol.parse(line) for line in read_lines(str(directory))]
    return [p for p in out if measurement is None or p.measurement == measurement]


# --- the sidecar process on its own -----------------------------------------------------------
def _settings(tmp_path, **overrides):
    return Settings.resolve({"sink": "spool", "spool.directory": str(tmp_path), "gpu.source": "simulated",
                             "polling-interval": POLL_MS, "spool.flush-interval": 0.1, **overrides})


@pytest.mark.parametrize("how", ["pipe closed", "SIGTERM"])
def test_sidecar_samples_this_process_and_flushes_when_told_to_stop(tmp_path, how):
    reg = TaskRegistry(nthreads=2, managed_bytes=lambda: 7)
    reg.started(("work", 1), 4, 9)
    sidecar = Sidecar(_settings(tmp_path), "s1", "tcp://w:1", {"host": "h", "worker": "tcp://w:1"}, reg.snapshot())
    try:
        sidecar.publisher.update(7, 0.0)
        assert sidecar.wait_ready(30)
        wait_until(lambda: len(points(tmp_path, "gpu")) >= 3, what="3 flushed samples")
        if how == "SIGTERM":
            sidecar.proc.terminate()
            assert sidecar.proc.wait(10) == 0
    finally:
        code = sidecar.close()
    assert code == 0 and sidecar.poll() == 0
    workers = points(tmp_path, "worker")
    assert workers and all(p.tags["job"] == "4" and p.tags["dag"] == "9" for p in workers)
    assert {p.fields["running"] for p in workers} == {'[["work", 1]]'}
    rss = psutil.Process().memory_info().rss  # the sidecar read this process (its parent), not itself
    assert all(abs(p.fields["rss"] - rss) < 0.5 * rss for p in workers)


def test_sidecar_wakes_for_a_task_on_an_idle_worker_and_samples_unsampled_tasks_before_it_exits(tmp_path):
    """3 things the in-process sampler does, through the pipe and the heartbeat: an extra sample when
    a task starts on a worker its last sample saw idle; a last sample at exit for a task that started
    and ended after the last one; its sink's delivery counters."""
    sidecar = Sidecar(_settings(tmp_path, **{"polling-interval": 5000}), "s1", "tcp://w:1",
                      {"host": "h", "worker": "tcp://w:1"}, TaskRegistry(nthreads=2).snapshot())
    try:
        assert sidecar.wait_ready(30)
        wait_until(lambda: sidecar.stats()["samples"] >= 1, what="the first sample (idle)")
        sidecar.publisher.started("first", 1, 5)
        sidecar.wake()
        wait_until(lambda: any(p.tags["dag"] == "5" for p in points(tmp_path, "worker")), timeout=4,
                   what="the extra sample, long before the next tick (5 s)")
        sidecar.wake()  # not sampled since the last wake: nothing sent
        sidecar.publisher.ended("first")
        sidecar.publisher.started("brief", 2, 6)
        sidecar.publisher.ended("brief")
        wait_until(lambda: sum(c.get("points_written", 0) for c in sidecar.counters()) >= 2,
                   what="the sink's counters in the heartbeat")
        assert [c["kind"] for c in sidecar.counters()] == ["spool"]
    finally:
        assert sidecar.close() == 0
    last = [p for p in points(tmp_path, "worker") if p.tags["dag"] == "6"]
    assert [p.fields["running"] for p in last] == ['["brief"]'], "a last sample shows the brief task"
    assert len(points(tmp_path, "worker")) == 3  # first sample, the woken one, the last one


# --- a real cluster ----------------------------------------------------------------------------
def slow(x, delay=0.3):
    threading.Event().wait(delay)  # a task that takes a while (simulated work)
    return x


@custom_metric("index-plus-one", per_device=True)
def index_plus_one(worker, handle):
    return handle.index + 1


@pytest.fixture
def monitor(client, tmp_path):
    m = Monitor(client, sink="spool", spool_directory=str(tmp_path), gpu_source="simulated", gpu_count=2,
                isolate=True, flush_interval=0.1)
    yield m
    if m.jobs()["session"]:  # the test did not stop it
        m.stop()


def pids(client) -> dict:
    """{worker address: (worker pid, sidecar pid or None)}."""
    def get(dask_worker):
        sidecar = dask_worker.plugins["influx-metrics"].sidecar
        return os.getpid(), sidecar.pid if sidecar else None

    return client.run(get)


def alive(pid) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_isolated_samples_carry_job_dag_and_the_workers_own_rss(cluster, client, monitor, tmp_path):
    monitor.attach(polling_interval=POLL_MS)
    monitor.start()
    before = pids(client)
    assert all(s is not None and s != w and psutil.Process(s).ppid() == w for w, s in before.values())
    ballast = next(iter(before))  # this worker grows by 300 MiB; its sidecar does not
    client.run(lambda dask_worker: setattr(dask_worker, "_ballast", bytearray(b"\1") * (300 << 20)),
               workers=[ballast])
    with Client(cluster) as a, Client(cluster) as b:
        fa = a.map(slow, range(6), key=[f"a-{i}" for i in range(6)])
        fb = b.map(slow, range(6), key=[f"b-{i}" for i in range(6)])
        a.gather(fa), b.gather(fb)
    monitor.stop()
    client.run(lambda dask_worker: delattr(dask_worker, "_ballast"), workers=[ballast])
    dags = monitor.jobs()["dags"]
    owner = {("a" if d["client"] == a.id else "b"): (str(d["job"]), str(n)) for n, d in dags.items()}
    busy = [p for p in points(tmp_path, "worker") if p.fields.get("tasks")]
    assert busy
    for p in busy:  # a sample lists its running keys' jobs and DAGs, and only those
        running = {owner[key[0]] for key in json.loads(p.fields["running"])}
        assert p.tags["job"] == ",".join(sorted({j for j, _ in running}, key=int)), p
        assert p.tags["dag"] == ",".join(sorted({d for _, d in running}, key=int)), p
    rss = {w: max(p.fields["rss"] for p in points(tmp_path, "worker") if p.tags["worker"] == w) for w in before}
    assert rss[ballast] > 300 << 20 > max(r for w, r in rss.items() if w != ballast)
    uuids = client.run(simulated_uuid, 1)
    assert {(p.tags["worker"], p.tags["uuid"]) for p in points(tmp_path, "gpu") if p.tags["index"] == "1"} == \
        set(uuids.items())  # the worker's device UUIDs, not the sidecar's


def test_stop_leaves_no_sidecar_behind(client, monitor):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    monitor.start()
    before = pids(client)
    assert all(alive(s) for _, s in before.values())
    monitor.stop()
    for worker_pid, sidecar_pid in before.values():
        assert not psutil.pid_exists(sidecar_pid)  # exited and reaped (no zombie)
        assert not [c for c in psutil.Process(worker_pid).children() if "sidecar" in " ".join(c.cmdline())]


def test_custom_metrics_stay_in_the_worker_with_the_same_tags(client, monitor, tmp_path):
    monitor.attach(polling_interval=POLL_MS, tracking=["compute-util"], custom_metrics=[index_plus_one])
    monitor.start()
    client.gather(client.map(slow, range(4), pure=False))
    monitor.stop()
    custom, gpu = points(tmp_path, "custom"), points(tmp_path, "gpu")
    assert {p.fields["index-plus-one"] for p in custom} == {1.0, 2.0}
    series = lambda ps: {(p.tags["worker"], p.tags["index"], p.tags["uuid"]) for p in ps}  # noqa: E731
    assert series(custom) == series(gpu) and len(series(gpu)) == 4
    assert {p.tags["dag"] for p in custom} >= {"0", "1"}


def test_a_killed_sidecar_falls_back_to_sampling_in_process(client, monitor, tmp_path):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks", "worker-mem", "compute-util"])
    monitor.start()
    victim, (worker_pid, sidecar_pid) = next(iter(pids(client).items()))
    os.kill(sidecar_pid, signal.SIGKILL)
    wait_until(lambda: pids(client)[victim][1] is None, what="fallback")
    assert not psutil.pid_exists(sidecar_pid)  # reaped by the worker
    killed_at = time.time_ns()
    threads = client.run(lambda: sum(t.name == "influx-metrics-sampler" for t in threading.enumerate()))
    assert threads[victim] == 1
    client.gather(client.map(slow, range(4), pure=False))
    wait_until(lambda: len([p for p in points(tmp_path, "worker")
                            if p.tags["worker"] == victim and p.time_ns > killed_at]) >= 5,
               what="samples after the kill")
    monitor.stop()
    events = [e for _, e in client.get_events("influx-metrics") if e.get("what") == "sidecar"]
    assert [e["worker"] for e in events] == [victim] and "exited" in events[0]["message"]
    after = [p for p in points(tmp_path, "worker") if p.tags["worker"] == victim and p.time_ns > killed_at]
    assert {abs(p.fields["rss"] - psutil.Process(worker_pid).memory_info().rss) < 1 << 28 for p in after} == {True}


def test_a_hung_sidecar_is_treated_as_dead_reported_once_and_replaced(client, monitor, tmp_path):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks", "worker-mem"])
    monitor.start()
    victim, (worker_pid, sidecar_pid) = next(iter(pids(client).items()))
    since = time.time()
    os.kill(sidecar_pid, signal.SIGSTOP)  # alive, but samples nothing
    stopped_at = time.monotonic()
    try:
        wait_until(lambda: pids(client)[victim][1] is None, timeout=10, what="fallback")
        detected = time.monotonic() - stopped_at
        wait_until(lambda: not psutil.pid_exists(sidecar_pid), timeout=10, what="the hung sidecar killed and reaped")
    finally:
        if psutil.pid_exists(sidecar_pid):
            os.kill(sidecar_pid, signal.SIGKILL)
    replaced_at = time.time_ns()
    wait_until(lambda: len([p for p in points(tmp_path, "worker")
                            if p.tags["worker"] == victim and p.time_ns > replaced_at]) >= 5,
               what="samples after the replacement")
    monitor.stop()
    print(f"hung sidecar detected after {detected:.2f} s (3 intervals = {3 * POLL_MS / 1000:.2f} s)")
    events = [e for t, e in client.get_events("influx-metrics") if e.get("what") == "sidecar" and t > since]
    assert [e["worker"] for e in events] == [victim] and "no sample" in events[0]["message"]
    assert detected < 3 * POLL_MS / 1000 + 2.5  # 3 intervals, checked once a second


def test_a_sidecar_that_cannot_start_is_reported_and_the_worker_samples_itself(client, monitor, tmp_path):
    def break_python(dask_worker, path):
        sys.executable, old = path, sys.executable
        return old

    old = client.run(break_python, path="/nonexistent/python")
    try:
        monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
        monitor.start()
        assert {s for _, s in pids(client).values()} == {None}
        wait_until(lambda: {p.tags["worker"] for p in points(tmp_path, "worker")} == set(old), what="samples")
        monitor.stop()
    finally:
        for address, path in old.items():
            client.run(break_python, path=path, workers=[address])
    events = [e for _, e in client.get_events("influx-metrics") if e.get("what") == "sidecar"]
    assert len(events) >= 2 and all("cannot start" in e["message"] for e in events[-2:])


def test_the_sidecar_exits_when_its_worker_dies(cluster, client, monitor):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    monitor.start()
    address, (worker_pid, sidecar_pid) = next(iter(pids(client).items()))
    os.kill(worker_pid, signal.SIGKILL)  # the nanny restarts the worker
    wait_until(lambda: not alive(sidecar_pid), what="the orphaned sidecar to exit")
    client.wait_for_workers(2, timeout=60)
