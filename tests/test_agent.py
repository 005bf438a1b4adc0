"""The sampling agent with a real LocalCluster: one per host and session, tags, lifetime, replacement.

The run folder and the agent process on their own: ``test_agent_link.py``; who gets which reading:
``test_gpu_attribution.py``.
"""

import functools
import json
import os
import pathlib
import signal
import sys
import threading
import time
from collections import Counter

import psutil
import pytest
from distributed import Client
from polling import wait_until as poll_until

from dask_influx_metrics import Monitor, custom_metric, lineparse
from dask_influx_metrics.link import runfolder
from dask_influx_metrics.link.outbox import Outbox
from dask_influx_metrics.sampling.sources.simulated import simulated_uuid
from dask_influx_metrics.sinks.spool import read_lines

POLL_MS = 50


wait_until = functools.partial(poll_until, timeout=20.0, step=0.02)  # agents start slowly on 2 cores


def points(directory, measurement=None):
    out = [lineparse.parse(line) for line in read_lines(str(directory))]
    return [p for p in out if measurement is None or p.measurement == measurement]


def slow(x, delay=0.3):
    threading.Event().wait(delay)  # a task that takes a while (simulated work)
    return x


@custom_metric("index-plus-one", per_device=True)
def index_plus_one(worker, handle):
    return handle.index + 1


@pytest.fixture
def monitor(client, tmp_path):
    m = Monitor(
        client, sink="spool", spool_directory=str(tmp_path), gpu_source="simulated", gpu_count=2, flush_interval=0.1
    )
    yield m
    if m.jobs()["session"]:  # the test did not stop it
        m.stop()


def agents(client) -> dict:
    """{worker address: (worker pid, agent pid from its beat, or None)}."""

    def get(dask_worker):
        link = dask_worker.plugins["influx-metrics"].link
        beat = link.beat() if link else None
        return os.getpid(), beat["pid"] if beat else None

    found = client.run(get, on_error="return")  # a worker just killed answers with an error
    return {w: r for w, r in found.items() if not isinstance(r, BaseException)}


def alive(pid) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def test_one_agent_samples_every_worker_with_its_own_tags(cluster, client, monitor, tmp_path):
    monitor.attach(polling_interval=POLL_MS)
    session = monitor.start()
    found = agents(client)
    (agent,) = {a for _, a in found.values()}
    assert agent not in {w for w, _ in found.values()} and "dask_influx_metrics.agent" in " ".join(
        psutil.Process(agent).cmdline()
    ), "one agent process for the host's workers"
    assert {d["gpu"]["gpu"] for w, d in session["destinations"].items() if w != "scheduler"} == {"simulated"}
    ballast = next(iter(found))  # this worker grows by 300 MiB; the others do not
    client.run(lambda dask_worker: setattr(dask_worker, "_ballast", bytearray(b"\1") * (300 << 20)), workers=[ballast])
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
    rss = {w: max(p.fields["rss"] for p in points(tmp_path, "worker") if p.tags["worker"] == w) for w in found}
    assert rss[ballast] > 300 << 20 > max(r for w, r in rss.items() if w != ballast)
    uuids = client.run(simulated_uuid, 1)
    assert {(p.tags["worker"], p.tags["uuid"]) for p in points(tmp_path, "gpu") if p.tags["index"] == "1"} == set(
        uuids.items()
    )  # each worker's own simulated devices
    hosts = points(tmp_path, "host")
    assert len(hosts) == len({p.time_ns for p in hosts}), "the host is written once per sample"
    jobs = {p.tags["job"] for p in hosts if p.tags["dag"] != "0"}
    assert {"1,2"} <= jobs or {"1", "2"} <= jobs, "host points carry every worker's jobs"


def test_stop_leaves_no_agent_and_no_run_folder(client, monitor):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    session = monitor.start()
    (agent,) = {a for _, a in agents(client).values()}
    folder = runfolder.session_folder(session["id"])
    assert alive(agent) and os.path.isdir(folder)
    monitor.stop()
    wait_until(lambda: not alive(agent), timeout=10, what="the agent to exit")
    wait_until(lambda: not os.path.exists(folder), timeout=10, what="the run folder removed")


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


def _gap_after(tmp_path, worker, since_ns) -> float:
    """Seconds from the last sample of ``worker`` before ``since_ns`` to its first after it."""
    times = sorted(p.time_ns for p in points(tmp_path, "worker") if p.tags["worker"] == worker)
    before = max(t for t in times if t <= since_ns)
    return (min(t for t in times if t > since_ns) - before) / 1e9


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_dead_or_hung_agent_is_replaced_within_3_intervals_and_1_s(client, monitor, tmp_path, how):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks", "worker-mem"])
    monitor.start()
    worker, (_, agent) = next(iter(agents(client).items()))
    wait_until(lambda: len(points(tmp_path, "worker")) >= 4, what="samples before")
    beat = next(iter(client.run(lambda dask_worker: dask_worker.plugins["influx-metrics"].link.beat()).values()))
    since, at = time.time(), time.time_ns()
    os.kill(agent, how)
    try:
        wait_until(lambda: {a for _, a in agents(client).values()} - {agent, None}, timeout=10, what="a new agent")
        wait_until(
            lambda: any(p.time_ns > at for p in points(tmp_path, "worker") if p.tags["worker"] == worker),
            timeout=10,
            what="samples after",
        )
    finally:
        if alive(agent):
            os.kill(agent, signal.SIGKILL)
    before = [p for p in points(tmp_path, "worker") if p.tags["worker"] == worker and p.time_ns <= at]
    assert len(before) >= beat["samples"] - 1, "every sample the agent took before it died is on disk"
    gap = _gap_after(tmp_path, worker, at)
    print(f"agent {signal.Signals(how).name}: gap {gap:.3f} s (limit {3 * POLL_MS / 1000 + 1:.2f} s)")
    assert gap <= 3 * POLL_MS / 1000 + 1.0
    wait_until(
        lambda: any(c.get("dead") and c["agent"] == agent for c in monitor.delivery()[worker]),
        timeout=5,
        what="the dead agent's counters kept",
    )
    monitor.stop()
    events = [e for t, e in client.get_events("influx-metrics") if e.get("what") == "agent" and t >= since]
    assert events and len({e["message"] for e in events}) <= 2, events  # said once (per worker that saw it)


def test_an_agent_that_cannot_start_is_reported_and_the_worker_samples_itself(client, monitor, tmp_path):
    def break_python(dask_worker, path):
        sys.executable, old = path, sys.executable
        return old

    old, since = client.run(break_python, path="/nonexistent/python"), time.time()
    try:
        monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
        monitor.start()
        wait_until(lambda: {p.tags["worker"] for p in points(tmp_path, "worker")} == set(old), what="samples")
        monitor.stop()
    finally:
        for address, path in old.items():
            client.run(break_python, path=path, workers=[address])
    events = [e for t, e in client.get_events("influx-metrics") if e.get("what") == "agent" and t >= since]
    # each worker's last word: it samples itself (the first to try fails at once; another that found the lock
    # still held by the failed launch retries on its watcher's looks first); no agent is ever said to have started
    last = {e["worker"]: e["message"] for e in events}
    assert set(last) == set(old) and all("sampling in-process" in m for m in last.values()), events
    assert not [e for e in events if "another was started" in e["message"]], events


def test_thread_mode_samples_in_the_worker(client, tmp_path):
    m = Monitor(
        client,
        sink="spool",
        spool_directory=str(tmp_path),
        gpu_source="simulated",
        flush_interval=0.1,
        sampler_mode="thread",
    )
    m.attach(polling_interval=POLL_MS, tracking=["tasks", "compute-util", "host-cpu"])
    m.start()
    assert {a for _, a in agents(client).values()} == {None}
    client.gather(client.map(slow, range(4), pure=False))
    m.stop()
    assert {p.tags["worker"] for p in points(tmp_path, "gpu")} == set(client.scheduler_info()["workers"])
    assert len({p.tags["worker"] for p in points(tmp_path, "host")}) == 2, "thread mode: each worker its own"


def test_a_killed_worker_is_forgotten_and_its_restart_joins_the_agent(cluster, client, monitor, tmp_path):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    monitor.start()
    before = agents(client)
    (agent,) = {a for _, a in before.values()}
    victim, (victim_pid, _) = next(iter(before.items()))
    os.kill(victim_pid, signal.SIGKILL)  # the nanny starts a new worker process
    wait_until(
        lambda: victim_pid not in {w for w, _ in agents(client).values()} and len(agents(client)) == 2,
        timeout=60,
        what="the restarted worker",
    )
    assert {a for _, a in agents(client).values()} == {agent}, "the same agent samples the new worker"
    folder = runfolder.session_folder(monitor.jobs()["session"]["id"])
    wait_until(lambda: str(victim_pid) not in runfolder.worker_files(folder), timeout=5, what="the dead one forgotten")
    monitor.stop()


def test_agents_that_keep_dying_make_the_workers_sample_in_process(client, monitor, tmp_path):
    def break_python(dask_worker, path):
        sys.executable, old = path, sys.executable
        return old

    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    monitor.start()
    (agent,) = {a for _, a in agents(client).values()}
    old = client.run(break_python, path="/nonexistent/python")  # the next agents cannot start
    try:
        since = time.time()
        os.kill(agent, signal.SIGKILL)
        wait_until(
            lambda: all(
                s
                for s in client.run(
                    lambda dask_worker: (
                        dask_worker.plugins["influx-metrics"].core is not None
                        and dask_worker.plugins["influx-metrics"].link is None
                    )
                ).values()
            ),
            timeout=20,
            what="every worker sampling in-process",
        )
        at = time.time_ns()
        wait_until(
            lambda: {p.tags["worker"] for p in points(tmp_path, "worker") if p.time_ns > at} == set(old),
            what="in-process samples",
        )
    finally:
        for address, path in old.items():
            client.run(break_python, path=path, workers=[address])
    monitor.stop()
    events = [e["message"] for t, e in client.get_events("influx-metrics") if e.get("what") == "agent" and t >= since]
    assert any("stopped 4 times" in m and "sampling in-process" in m for m in events), events


def test_a_worker_the_agent_cannot_see_samples_in_process(client, monitor, tmp_path):
    """Another PID namespace (containers sharing /dev/shm only): the agent would read another process."""

    def pretend(dask_worker, on: bool):
        from dask_influx_metrics.link import runfolder

        if on:  # this worker's process "started" at tick 1: not what the agent sees
            runfolder.real_started, runfolder.started = runfolder.started, lambda pid="self": 1
        else:
            runfolder.started = runfolder.real_started

    client.run(pretend, on=True)
    try:
        monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
        monitor.start()
        assert {a for _, a in agents(client).values()} == {None}, "no worker stays with the agent"
        wait_until(
            lambda: {p.tags["worker"] for p in points(tmp_path, "worker")} == set(client.scheduler_info()["workers"]),
            what="in-process samples",
        )
        monitor.stop()
    finally:
        client.run(pretend, on=False)
    events = [e["message"] for _, e in client.get_events("influx-metrics") if e.get("what") == "agent"]
    assert any("different PID namespaces" in m for m in events), events


def test_a_run_folder_open_to_others_is_refused_at_start(client, monitor, tmp_path):
    """Issue 23 item 8: another local user who pre-creates the run folder could see or plant workers'
    registrations; start() fails naming it, as for a foreign spool root."""
    hostile = tmp_path / "dask-influx-metrics-run"
    hostile.mkdir(mode=0o777)
    os.chmod(hostile, 0o777)

    def point_at(dask_worker, folder):
        from dask_influx_metrics.link import runfolder

        if folder:
            runfolder.real_run_directory = runfolder.run_directory
            runfolder.run_directory = lambda base=None: runfolder.private_folder(folder)
        else:
            runfolder.run_directory = runfolder.real_run_directory

    client.run(point_at, folder=str(hostile))
    try:
        monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
        with pytest.raises(RuntimeError, match="dask-influx-metrics-run.* is not a private folder"):
            monitor.start()
    finally:
        client.run(point_at, folder=None)
    events = [e["message"] for _, e in client.get_events("influx-metrics") if e.get("what") == "agent"]
    assert any("refused to start" in m and "not a private folder" in m for m in events), events


def outbox_lines(folder, worker_id):
    """The lines a worker's outbox holds on disk (every segment)."""
    names = sorted(n for n in os.listdir(os.path.join(folder, runfolder.WORKERS)) if n.startswith(f"{worker_id}.out-"))
    data = b"".join(pathlib.Path(folder, runfolder.WORKERS, n).read_bytes() for n in names)
    return [line for line in data.split(b"\n") if line]


@pytest.mark.parametrize("agent_too", [False, True], ids=["agent-continued", "agent-killed-too"])
def test_a_killed_workers_points_written_but_not_sent_arrive_once(client, monitor, tmp_path, agent_too):
    """Issue 35: the agent is the host's only sender. A worker's task points wait in its outbox; the worker is
    SIGKILLed before the agent (stopped meanwhile) sent them: the agent sends them when it sees it dead. With the
    agent killed too, the next agent cannot tell a dead pid from one in another PID namespace; the worker's life
    lock, free once it died, tells it."""
    monitor.attach(polling_interval=2000, tracking=["task-stream", "tasks"])  # hung only after 6.25 s stopped
    session = monitor.start()
    folder = runfolder.session_folder(session["id"])
    found = agents(client)
    (agent,) = {a for _, a in found.values()}
    victim, (victim_pid, _) = next(iter(found.items()))
    victim_id = client.run(lambda dask_worker: dask_worker.plugins["influx-metrics"].link.id, workers=[victim])[victim]
    os.kill(agent, signal.SIGSTOP)  # sends nothing now
    try:
        keys = [f"doomed-{i}" for i in range(5)]
        client.gather(client.map(slow, range(5), delay=0.01, key=keys, workers=[victim]))
        wait_until(lambda: len(outbox_lines(folder, victim_id)) >= 5, timeout=5, what="the points written")
        os.kill(victim_pid, signal.SIGKILL)
    finally:
        os.kill(agent, signal.SIGKILL if agent_too else signal.SIGCONT)
    wait_until(lambda: {p.fields["key"] for p in points(tmp_path, "task")} >= set(keys), what="the points sent")

    def victims_files():
        try:
            return [n for n in os.listdir(os.path.join(folder, runfolder.WORKERS)) if n.startswith(f"{victim_id}.")]
        except FileNotFoundError:  # the session's folder is gone
            return []

    wait_until(lambda: not victims_files(), timeout=5, what="the dead worker's files removed once sent")
    monitor.stop()
    sent = [p.fields["key"] for p in points(tmp_path, "task") if p.fields["key"] in keys]
    assert sorted(sent) == sorted(keys), "each once"


def test_an_agent_replaced_mid_session_loses_and_doubles_no_point(client, monitor, tmp_path):
    """Issue 35: the next agent sends what the killed one left in the workers' outboxes, from where it noted."""
    monitor.attach(polling_interval=POLL_MS, tracking=["task-stream", "tasks"])
    monitor.start()
    (agent,) = {a for _, a in agents(client).values()}
    keys = [f"steady-{i}" for i in range(240)]
    futures = client.map(slow, range(240), delay=0.01, key=keys)  # ~1.2 s of tasks on 2 x 2 threads
    wait_until(lambda: len(points(tmp_path, "task")) >= 20, what="task points before")
    os.kill(agent, signal.SIGKILL)
    client.gather(futures)
    wait_until(lambda: {a for _, a in agents(client).values()} - {agent, None}, timeout=10, what="a new agent")
    monitor.stop()
    sent = [p.fields["key"] for p in points(tmp_path, "task")]
    assert sorted(sent) == sorted(keys), f"{len(sent)} task points for {len(keys)} tasks, {len(set(sent))} distinct"


def test_a_dead_sessions_unsent_points_are_sent_by_the_next_agent(client, monitor, tmp_path):
    """Never delete the only copy: a session whose processes all died left points in an outbox. The next agent
    on the host moves them into its own session before it removes the dead one's folder, and sends them (a
    backlog: over several samples), each once."""
    dead = os.path.join(runfolder.run_directory(), "a-dead-session")
    with runfolder.locked(dead, runfolder.START_LOCK):
        runfolder.write_worker(dead, "999999999", {"pid": 999999999})
    box = Outbox(os.path.join(dead, runfolder.WORKERS), "999999999")
    keys = [f"left-{i:05d}-" + "k" * 80 for i in range(4000)]  # ~0.5 MB: more than one sample sends
    box.send(
        [b'task,worker=gone key="%s" %d' % (k.encode(), 1_700_000_000_000_000_000 + i) for i, k in enumerate(keys)]
    )
    box.close()
    monitor.attach(polling_interval=POLL_MS)
    monitor.start()

    def sent():
        return [p.fields["key"] for p in points(tmp_path, "task") if p.fields["key"].startswith("left-")]

    wait_until(lambda: len(sent()) >= len(keys), what="the dead session's points sent")
    assert not os.path.exists(dead)
    monitor.stop()
    assert sorted(sent()) == keys, "each once"


def test_a_backlog_left_at_stop_is_sent_whole_before_the_agent_exits(client, monitor, tmp_path):
    """The agent sends a backlog in parts (256 KiB per worker and sample); stopping the session must not cut it."""
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    monitor.start()
    (agent,) = {a for _, a in agents(client).values()}
    keys = [f"backlog-{i:05d}-" + "k" * 80 for i in range(12000)]  # ~1.5 MB: six parts or more

    def write(dask_worker, keys=keys):
        lines = [b'task,worker=w key="%s" %d' % (k.encode(), 1_700_000_000_000_000_000 + i) for i, k in enumerate(keys)]
        dask_worker.plugins["influx-metrics"].link.outbox.send(lines)

    os.kill(agent, signal.SIGSTOP)  # the lines pile up
    try:
        client.run(write, workers=[next(iter(client.scheduler_info()["workers"]))])
    finally:
        os.kill(agent, signal.SIGCONT)
    monitor.stop()
    wait_until(lambda: not alive(agent), what="the agent gone")
    sent = [p.fields["key"] for p in points(tmp_path, "task") if p.fields["key"].startswith("backlog-")]
    assert sorted(sent) == keys, f"{len(sent)} of {len(keys)} sent, {len(set(sent))} distinct"


def test_the_monitor_adds_one_thread_to_a_worker_beside_the_agent(client, monitor):
    """Issue 35: the link's thread watches the agent and writes the worker's own points; nothing else."""

    def names(dask_worker):
        return [t.name for t in threading.enumerate()]

    client.gather(client.map(slow, range(8), delay=0.05, pure=False))  # the workers' own task threads
    before = client.run(names)
    monitor.attach(polling_interval=POLL_MS)  # every metric: the task stream and the fine metrics too
    monitor.start()
    client.gather(client.map(slow, range(8), delay=0.05, pure=False))
    during = client.run(names)
    monitor.stop()
    added = {w: sorted((Counter(during[w]) - Counter(before[w])).elements()) for w in before}
    print("threads added per worker:", added)
    assert all(len(a) <= 1 for a in added.values()), added
