"""The run folder, a worker's link to the agent and the agent process, without Dask.

"Workers" here are :class:`AgentLink` s in this process (ids ``<pid>.<n>``), as
several workers of one ``processes=False`` cluster are.
"""

import dataclasses
import functools
import os
import shutil
import threading
import time
import types

import psutil
import pytest
from polling import wait_until as poll_until

from dask_influx_metrics import lineparse
from dask_influx_metrics.config import Settings
from dask_influx_metrics.link import runfolder
from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.sinks.spool import read_lines
from dask_influx_metrics.worker.agentlink import AgentLink

wait_until = functools.partial(poll_until, timeout=20.0, step=0.01)  # agents start slowly on 2 cores


def points(directory, measurement="worker"):
    return [p for p in map(lineparse.parse, read_lines(str(directory))) if p.measurement == measurement]


@pytest.fixture
def config(tmp_path):
    def make(**overrides):
        settings = Settings.resolve(
            {
                "sink": "spool",
                "spool.directory": str(tmp_path),
                "gpu.source": "simulated",
                "polling-interval": 50,
                "spool.flush-interval": 0.1,
                **overrides,
            }
        )
        return {"settings": dataclasses.asdict(settings), "session": f"test-{os.getpid()}-{time.time_ns()}"}

    return make


def link(config, n, reports=None, running=()):
    info = {"address": f"tcp://w:{n}", "tags": {"host": "h", "worker": f"tcp://w:{n}"}, "visible": None, "nthreads": 2}
    return AgentLink(
        config,
        info,
        Snapshot(running, 2, 0, 0),
        lambda what, message, **d: (reports if reports is not None else []).append((what, message)),
    )


def agent_processes(folder):
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if "dask_influx_metrics.agent" in " ".join(p.info["cmdline"] or [])
        and p.status() != psutil.STATUS_ZOMBIE
        and os.path.exists(os.path.join(folder, runfolder.BEAT))
    ]


def test_workers_starting_at_once_leave_exactly_one_agent_which_exits_with_the_last(config):
    cfg = config()
    barrier, links = threading.Barrier(4), []

    def join(n):
        barrier.wait()
        links.append(link(cfg, n))

    threads = [threading.Thread(target=join, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(x._ready is not None for x in links) == 1, "one of them launched the agent"
    for x in links:
        x.started()
    wait_until(lambda: all(x.beat() for x in links), what="every worker sees the beat")
    (pid,) = {x.beat()["pid"] for x in links}
    wait_until(lambda: all(x.id in x.beat()["found"] for x in links), what="the agent sampled every worker")
    folder = links[0].folder
    for x in links[:-1]:
        x.leave()
    assert psutil.pid_exists(pid), "the agent outlives any one worker"
    links[-1].leave()
    wait_until(
        lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
        what="the agent exits with the last worker",
    )
    wait_until(lambda: not os.path.exists(folder), what="its run folder removed")


def test_a_task_on_an_idle_worker_wakes_the_agent_and_leave_samples_unsampled_tasks(config, tmp_path):
    w = link(config(**{"polling-interval": 5000}), 1)  # ticks 5 s apart: anything sooner is a wake
    try:
        wait_until(lambda: w.beat() and w.beat()["samples"] >= 1, what="the first (idle) sample")
        w.publisher.started("first", 1, 5)
        w.wake()
        wait_until(
            lambda: any(p.tags["dag"] == "5" for p in points(tmp_path)),
            timeout=4,
            what="the woken sample, long before the next tick",
        )
        wait_until(lambda: not w._beat.saw_idle(), what="the beat: the agent saw this worker busy")
        sock, sent = w._sock, []
        w._sock = types.SimpleNamespace(sendto=lambda data, to: sent.append(data))
        w.wake()  # another task starting now
        w.wake()  # and another, before the agent's next sample
        w._sock = sock
        assert sent == [], "its latest sample saw a task here: no datagram"
        w.publisher.ended("first")
        w.publisher.started("brief", 2, 6)
        w.publisher.ended("brief")
        assert w.publisher.unsampled()
    finally:
        w.leave()
    last = [p for p in points(tmp_path) if p.tags["dag"] == "6"]
    assert [p.fields["running"] for p in last] == ['["brief"]'], "leaving, the agent samples the brief task"


def test_stale_session_folders_are_removed_and_live_ones_kept(tmp_path):
    import subprocess
    import sys

    run = str(tmp_path)
    dead, live, busy = (os.path.join(run, n) for n in ("dead", "live", "busy"))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for folder, pid in ((dead, 999999999), (live, proc.pid)):
            with runfolder.locked(folder, runfolder.START_LOCK):
                runfolder.write_worker(folder, str(pid), {"pid": pid})  # named by its pid, as workers are
        with runfolder.locked(busy, runfolder.START_LOCK):  # a worker arriving right now
            assert runfolder.remove_stale(run) == [dead]
    finally:
        proc.kill()
        proc.wait()
    assert sorted(os.listdir(run)) == ["busy", "live"]


def test_a_failing_every_is_said_once_and_the_watch_goes_on(monkeypatch, caplog):
    """The worker's own points are made on the link's thread: a bug there must not stop its watch of the agent."""
    import logging

    from dask_influx_metrics.worker import agentlink

    link = agentlink.AgentLink.__new__(agentlink.AgentLink)
    link._once = agentlink.Once()
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("a bug in the task stream")

    link._every, link._due, link._idle = (0.0, broken), 0.0, None
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            link._run_every()
    assert len(calls) == 3 and len([r for r in caplog.records if "a bug in the task stream" in r.getMessage()]) == 1


def test_the_run_folder_and_everything_in_it_is_private_by_design(config, tmp_path):
    """Issue 43 item 6: folders 0700, files and the wake socket 0600 whatever the umask (0 here: nothing is left
    to it), the spill folder on disk too."""
    import tempfile

    run = tempfile.mkdtemp(prefix="run")  # short: a Unix socket's path is 107 bytes at most
    old = os.umask(0)
    try:
        cfg = config(**{"run.directory": run})
        w = link(cfg, 1)
        wait_until(lambda: os.path.exists(os.path.join(w.folder, runfolder.SOCKET)), what="the agent's socket")
        w.outbox._rotate(runfolder.spill_folder(cfg["settings"]["spool_directory"], cfg["session"]))
    finally:
        os.umask(old)
    try:
        modes = {}
        for root in (os.path.join(run, f"dask-influx-metrics-{os.getuid()}"), str(tmp_path / cfg["session"])):
            for here, dirs, files in os.walk(root):
                for name in [here, *(os.path.join(here, f) for f in files)]:
                    modes[name] = oct(os.lstat(name).st_mode & 0o777)
        folders = {n: m for n, m in modes.items() if os.path.isdir(n)}
        files = {n: m for n, m in modes.items() if n not in folders}
        assert set(folders.values()) == {"0o700"}, folders
        assert set(files.values()) == {"0o600"}, files
        assert any(n.endswith("agent.sock") for n in files) and any("outbox-" in n for n in folders)
    finally:
        w.leave()
        shutil.rmtree(run, ignore_errors=True)


def test_the_worker_thread_wakes_for_its_points_only_when_there_are_some(config):
    """Issue 43 item 4 at no cost: the task stream is written at least every 200 ms while tasks run or wait for
    their points, and an idle worker's thread does not wake for it (nudge() when a task starts on it)."""
    w = link(config(**{"polling-interval": 1000}), 1)
    runs, pending = [], []
    try:
        w.every(0.2, lambda: runs.append(time.monotonic()) or pending.clear(), idle=lambda: not pending)
        time.sleep(1.0)
        assert runs == [], "idle: not one wake for it"
        pending.append(1)
        started = time.monotonic()
        w.nudge()
        wait_until(lambda: runs, timeout=1, what="a run after the nudge")
        assert runs[0] - started < 0.1, "the first task after an idle while: written at once"
        for _ in range(5):  # tasks keep ending: one write per 200 ms, not one per task
            pending.append(1)
            w.nudge()
            time.sleep(0.1)
        assert 2 <= len(runs) <= 5 and all(b - a >= 0.19 for a, b in zip(runs, runs[1:])), runs
    finally:
        w.leave()


def test_the_agent_is_never_this_processs_child_and_nothing_is_left_to_reap(config):
    """Issue 48: the agent outlives the worker that launched it. It is forked by a launcher that exits at once,
    so the worker has only the launcher to reap: no un-reaped child, no ResourceWarning from a dropped Popen."""
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w = link(config(), 1)
        try:
            w.started()
            wait_until(lambda: w.beat() is not None, what="the agent's beat")
            agent = psutil.Process(w.beat()["pid"])
            assert agent.ppid() != os.getpid(), "the agent is re-parented, not this process's child"
            assert "-m dask_influx_metrics.agent" in " ".join(agent.cmdline()), "ps shows what it is"
            ours = [p for p in psutil.Process().children() if "dask_influx_metrics" in " ".join(p.cmdline())]
            assert ours == [] and w._launchers == [], "the launcher was reaped"
        finally:
            w.leave()
        gc.collect()
    assert [str(x.message) for x in caught if issubclass(x.category, ResourceWarning)] == []


def test_an_agent_whose_worker_left_before_it_was_ready_exits_at_once(config):
    """A cluster closed while its agent still starts: the agent finds no worker and goes (it waited 30 s)."""
    w = link(config(), 1)
    folder = w.folder
    w.leave()  # started() never called: nothing waits for the agent
    wait_until(lambda: not os.path.exists(folder), timeout=10, what="the agent gone, its run folder removed")


def test_leave_returns_once_the_agent_sampled_the_worker_not_at_its_next_tick(config, tmp_path):
    """The agent lets a leaving worker go in the round that sampled it: a close does not wait for a tick."""
    w = link(config(**{"polling-interval": 5000}), 1)  # the next tick is seconds away
    try:
        assert w.sampled(20) is not None, "the agent sampled the worker"
        w.publisher.started("brief", 1, 7)
        w.publisher.ended("brief")
    finally:
        t0 = time.monotonic()
        w.leave()
        took = time.monotonic() - t0
    assert took < 4.0, f"leave waited {took:.1f} s: for a tick 5 s away"
    assert any(p.tags["dag"] == "7" for p in points(tmp_path)), "its last sample is in the sink when leave returns"


def test_a_killed_agent_is_replaced_at_once_not_at_a_look(config):
    """The watchers wait on the agent's pidfd: a dead agent is seen the moment it exits. A look would see it only
    once its beat is over an interval old (here 2 s: it is killed just after one), or at the others' every 5 s."""
    import signal

    cfg = config(**{"polling-interval": 2000})
    a, b = link(cfg, 1), link(cfg, 2)
    try:
        a.started()
        wait_until(lambda: a.beat() is not None and b.beat() is not None, what="the agent's beat")
        wait_until(lambda: a._exit_fd is not None and b._exit_fd is not None, what="its exit waited for")
        time.sleep(1.2)  # past the watchers' first second (looks every 0.15 s)
        wait_until(lambda: time.monotonic() - a.beat()["time"] < 0.2, timeout=5, what="a fresh beat")
        old = a.beat()["pid"]
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: {p.pid for p in agent_processes(a.folder)} - {old}, timeout=10, what="the next agent")
        took = time.monotonic() - killed
        assert took < 1.0, f"the next agent came {took:.2f} s after the kill"
    finally:
        b.leave()
        a.leave()


def test_waiting_for_the_agent_works_with_descriptors_past_1023(config):
    """A worker with many connections open: the pipe the agent says "ready" on may be past descriptor 1023,
    where select.select fails (and with it a watcher replacing a dead agent)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("this process may not open 1,200 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1100:  # the link's own descriptors come after these
            held.append(os.open(os.devnull, os.O_RDONLY))
        w = link(config(), 1)
        try:
            w.started(timeout=20)
            assert w.found(20) is not None, "the agent sampled the worker"
        finally:
            w.leave()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_new_agents_beat_file_is_followed_while_other_threads_read_the_old_one(config):
    """The watcher and the event loop both read the agent's beat, and either may follow a new agent's file: the
    reader the other holds stays open until leave(), and the beat is never briefly unset (a Dask test failed on
    the watcher's "'NoneType' object is not callable" when the event loop followed the file first)."""
    import signal

    a = link(config(), 1)
    errors, stop = [], threading.Event()

    def reading():  # as the event loop's heartbeats and task starts do, meanwhile
        while not stop.is_set():
            try:
                a._follow_beat()
                a.beat()
            except Exception as e:
                errors.append(e)
            time.sleep(0.001)

    reader = threading.Thread(target=reading)
    try:
        a.started()
        wait_until(lambda: a.beat() is not None, what="the agent's beat")
        held, old = a._beat, a.beat()["pid"]
        reader.start()
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: (a.beat() or {}).get("pid") not in (None, old), what="the next agent's beat")
        assert a._beat is not held and held()["pid"] == old  # the old file's reader still reads its last beat
    finally:
        stop.set()
        if reader.is_alive():
            reader.join()
        a.leave()
    assert errors == []
    assert held.buffer.raw().closed  # closed at leave(), with the link's current reader


def test_an_agent_that_cannot_be_run_on_a_replace_is_said_so_never_started(config, monkeypatch):
    """A worker that found agent.lock held (a failed launch's child still holds it for a moment) replaces the agent
    on its watcher's looks; where the agent cannot even be run, each try is said as it is (no "another was
    started") and counted, and after MAX_RESTARTS the worker gives up (it then samples in-process)."""
    import sys

    from dask_influx_metrics.worker.agentlink import MAX_RESTARTS

    cfg, reports = config(), []
    folder = runfolder.session_folder(cfg["session"], cfg["settings"].get("run_directory"))
    os.makedirs(os.path.join(folder, runfolder.WORKERS), exist_ok=True)
    held = runfolder.try_lock(folder, runfolder.AGENT_LOCK)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    w = link(cfg, 1, reports)
    try:
        os.close(held)  # the lock is free: the watcher's next look (every 0.15 s in its first second) replaces
        wait_until(lambda: w.failed is not None, timeout=10, what="the worker giving up")
        tries = [m for _, m in reports if m.startswith("cannot start the sampling agent (FileNotFoundError")]
        assert len(tries) == MAX_RESTARTS, reports
        assert not [m for _, m in reports if "another was started" in m], reports
        assert f"stopped {MAX_RESTARTS + 1} times" in w.failed
    finally:
        w.leave()
