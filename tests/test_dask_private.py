"""Each private Dask API in :mod:`dask_influx_metrics._dask`, exercised against the installed Dask.

One test per touch point, on the real LocalCluster of ``conftest.py``. A failure reads
"distributed X changed <what>: <what breaks>", so a Dask upgrade that moves an
internal names the feature it breaks. ``scripts/test.sh`` runs this file on
every Dask release ``pyproject.toml`` allows.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import tokenize
import urllib.request

import distributed
import pytest
from distributed import get_worker, secede, worker_client
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from dask_influx_metrics import _dask

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dask_influx_metrics")
PRIVATE = re.compile(
    r"_send_to_scheduler|stream_handlers|protocol(\.|import)pickle|register_worker_plugin|submitting_task"
    r"|worker_plugins|worker\.(state|scheduler_delay|plugins|metrics)\b|digests_total|digest_metric"
    r"|\.last_seen\b|ws\.metrics|_applications|template_variables|http_application"
)
RECORDER = "test-dask-private-recorder"
OP = "test-dask-private-op"
MARK = "test-dask-private-mark"


@contextlib.contextmanager
def dask_contract(what: str, breaks: str):
    """Turn any failure inside into "distributed X changed <what>: <what breaks>"."""
    try:
        yield
    except Exception as e:  # AssertionError included
        pytest.fail(f"distributed {distributed.__version__} changed {what}: {breaks} ({type(e).__name__}: {e})")


def poll(fn, deadline_s: float = 10.0):
    """``fn()`` until it is truthy or the deadline passes; returns the last value."""
    deadline = time.monotonic() + deadline_s
    while not (value := fn()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


class Recorder(SchedulerPlugin):
    """Records graph submissions (with their submitting task) and OP messages, in arrival order."""

    def __init__(self):
        self.events = []

    def update_graph(self, scheduler, *, keys, tasks, **kwargs):
        self.events.append(("graph", _dask.parent_task_key(), sorted(map(str, keys))))
        for key in tasks:  # the job plugin's way of tagging tasks
            ts = scheduler.tasks[key]
            ts.annotations = {**(ts.annotations or {}), MARK: {"graph": len(self.events)}}

    def handle(self, client=None, **msg):
        self.events.append(("op", client, msg.get("value")))


async def _install(dask_scheduler=None):
    recorder = Recorder()
    recorder.wrapper = _dask.wrap_update_graph(dask_scheduler)
    _dask.add_stream_handler(dask_scheduler, OP, recorder.handle)
    dask_scheduler.add_plugin(recorder, name=RECORDER)


async def _uninstall(dask_scheduler=None) -> dict | None:
    recorder = dask_scheduler.plugins.get(RECORDER)
    if recorder is None:
        return None
    _dask.unwrap_update_graph(dask_scheduler, recorder.wrapper)
    _dask.remove_stream_handler(dask_scheduler, OP, recorder.handle)
    dask_scheduler.remove_plugin(name=RECORDER)
    return {
        "restored": dask_scheduler.stream_handlers["update-graph"] == dask_scheduler.update_graph,
        "op_removed": OP not in dask_scheduler.stream_handlers,
    }


def _events(dask_scheduler=None) -> list:
    return list(dask_scheduler.plugins[RECORDER].events)


def wait_events(client, n: int) -> list:
    """The recorder's events once there are ``n`` (or what there is after 10 s)."""
    deadline = time.monotonic() + 10.0
    while len(events := client.run_on_scheduler(_events)) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return events


@pytest.fixture
def recorder(client):
    """Installs a :class:`Recorder`; yields the uninstall step (which reports what it restored)."""
    client.run_on_scheduler(_install)
    yield lambda: client.run_on_scheduler(_uninstall)
    client.run_on_scheduler(_uninstall)


def spawn_child():
    with worker_client() as c:
        return c.submit(lambda: 1, key="child-of-parent").result()


def test_update_graph_handler_carries_the_submitting_task(client, recorder):
    with dask_contract(
        "the 'update-graph' stream handler or its 'submitting_task' field",
        "graphs submitted from inside tasks no longer join their parent's job",
    ):
        assert client.submit(spawn_child, key="parent").result() == 1
        events = wait_events(client, 2)
        assert ("graph", None, ["parent"]) in events, events
        assert ("graph", "parent", ["child-of-parent"]) in events, events
        assert recorder()["restored"], "unwrap_update_graph left the wrapper installed"


def test_client_stream_messages_reach_a_stream_handler_in_order_with_graphs(client, recorder):
    with dask_contract(
        "Client._send_to_scheduler or Scheduler.stream_handlers",
        "Monitor.new_job() fails, or is not ordered with the client's graph submissions",
    ):
        client.submit(lambda: 1, key="before")
        _dask.send_on_client_stream(client, {"op": OP, "value": 7})
        client.submit(lambda: 2, key="after")
        events = wait_events(client, 3)
        assert events == [("graph", None, ["before"]), ("op", client.id, 7), ("graph", None, ["after"])], events
        assert recorder()["op_removed"], "remove_stream_handler left the handler"


class Flag(WorkerPlugin):
    def __init__(self, fail: bool = False):
        self.fail = fail

    def setup(self, worker):
        if self.fail:
            raise RuntimeError("setup fails on purpose")
        worker.influx_test_flag = "set up"

    def teardown(self, worker):
        worker.influx_test_flag = "torn down"


async def _add_flag(dask_scheduler=None, fail=False):
    await _dask.add_worker_plugin(dask_scheduler, Flag(fail), "influx-test-flag")


async def _remove_flag(dask_scheduler=None) -> bool:
    return await _dask.remove_worker_plugin(dask_scheduler, "influx-test-flag")


def _flags(client) -> set:
    return set(client.run(lambda dask_worker: getattr(dask_worker, "influx_test_flag", None)).values())


def test_worker_plugins_are_added_and_removed_from_the_scheduler(client):
    with dask_contract(
        "Scheduler.register_worker_plugin/unregister_worker_plugin (or their replies)",
        "--preload and Monitor.start() cannot start sampling on the workers, or stop() cannot end it",
    ):
        client.run_on_scheduler(_add_flag)
        assert _flags(client) == {"set up"}, "not set up on every worker"
        assert client.run_on_scheduler(_remove_flag) is True
        assert _flags(client) == {"torn down"}, "not torn down on every worker"
        assert client.run_on_scheduler(_remove_flag) is False, "removing an absent plugin should say so"
        with pytest.raises(RuntimeError, match=r"set up .* on \d+ worker.*setup fails on purpose"):
            client.run_on_scheduler(_add_flag, fail=True)
        client.run_on_scheduler(_remove_flag)


def _plugin_flag(dask_worker):
    plugin = _dask.worker_plugin(dask_worker, "influx-test-flag")
    return None if plugin is None else type(plugin).__name__


def test_worker_plugin_instances_are_found_by_name(client):
    with dask_contract("Worker.plugins", "Monitor.delivery() cannot read the workers' sink counters"):
        client.run_on_scheduler(_add_flag)
        try:
            assert set(client.run(_plugin_flag).values()) == {"Flag"}
        finally:
            client.run_on_scheduler(_remove_flag)
        assert set(client.run(_plugin_flag).values()) == {None}


def test_pickle_carries_closures():
    offset = 41
    with dask_contract("distributed.protocol.pickle", "custom metrics defined as closures cannot reach the workers"):
        assert _dask.loads(_dask.dumps(lambda x: x + offset))(1) == 42


def _worker_view() -> dict:
    worker = get_worker()
    key = worker.get_current_task()
    return {
        "nthreads": _dask.worker_nthreads(worker),
        "bytes": _dask.worker_managed_bytes(worker),
        "running": key in _dask.worker_running_keys(worker),
        "offset": _dask.worker_clock_offset(worker),
        "mark": _dask.worker_task_annotation(worker, key, MARK),
    }


def _seceded_view() -> bool:
    secede()  # now long-running: its thread left the pool
    worker = get_worker()
    key = worker.get_current_task()
    return bool(
        poll(
            lambda: key in _dask.worker_running_keys(worker) and key in {ts.key for ts in worker.state.long_running}, 5
        )
    )


def test_worker_state_reads(client, recorder):
    with dask_contract(
        "Worker.state (nthreads, nbytes, executing, long_running, tasks[key].annotations) or Worker.scheduler_delay",
        "worker samples lose their job/dag tags, managed_bytes or clock alignment",
    ):
        worker = sorted(client.scheduler_info()["workers"])[0]
        held = client.submit(lambda: b"x" * 200_000, key="held", workers=[worker])
        held.result()  # stays in the worker's memory while `held` lives
        view = client.submit(_worker_view, key="view", workers=[worker]).result()
        assert view["nthreads"] == 2, view
        assert view["bytes"] >= 200_000, view
        assert view["running"], view
        assert isinstance(view["offset"], float | int), view
        assert isinstance(view["mark"], dict) and view["mark"]["graph"] >= 1, view
        assert client.submit(_seceded_view, key="seceded").result(), "a seceded task is not among the running keys"


TAPPED: dict = {}  # worker address -> (what the tap got, its undo); in the worker processes


def _tap(dask_worker) -> None:
    got: list = []
    TAPPED[dask_worker.address] = (got, _dask.tap_execute_digests(dask_worker, got.append))


def _ended(dask_worker, key) -> dict:
    end = _dask.worker_task_end(dask_worker, key)
    got, undo = TAPPED.pop(dask_worker.address, ([], lambda: None))
    undo()
    return {
        "end": end,
        "tapped": {(p, a, u) for p, a, u, _ in got},
        "totals": {k[2:] for k in dask_worker.digests_total if isinstance(k, tuple) and k[0] == "execute"},
        "untapped": "digest_metric" not in vars(dask_worker),
    }


def test_task_end_and_fine_performance_metrics(client):
    with dask_contract(
        "WorkerState.tasks[key] (state, prefix, startstops, nbytes) or Worker.digest_metric "
        "(('execute', span, prefix, activity, unit), amount) called through the instance",
        "the task stream loses its timings, sizes and states; activity points stop",
    ):
        worker = sorted(client.scheduler_info()["workers"])[0]
        client.run(_tap, workers=[worker])
        before = time.time()
        done = client.submit(lambda: b"y" * 1000, key="ended-task-1", workers=[worker])
        done.result()
        got = client.run(_ended, key="ended-task-1", workers=[worker])[worker]
        state, prefix, startstops, nbytes = got["end"]
        assert (state, prefix) == ("memory", "ended-task") and nbytes >= 1000, got
        [compute] = [s for s in startstops if s["action"] == "compute"]
        assert before - 5 < compute["start"] <= compute["stop"] < time.time() + 5, got  # scheduler clock, seconds
        assert ("ended-task", "thread-cpu", "seconds") in got["tapped"], got
        assert got["tapped"] <= got["totals"] and got["untapped"], got  # Dask still adds them; the undo undoes
        assert client.run(_ended, key="no-such-key", workers=[worker])[worker]["end"] is None


class _Digests:
    """Stands in for a worker: Dask's method adds up the digests."""

    def __init__(self):
        self.total: dict = {}

    def digest_metric(self, name, value):
        self.total[name] = self.total.get(name, 0) + value


EXECUTE = ("execute", "span-1", "inc", "thread-cpu", "seconds")


def test_taps_on_dask_digests_stack_and_come_off_in_either_order():
    w, a, b = _Digests(), [], []
    undo_a = _dask.tap_execute_digests(w, a.append)
    undo_b = _dask.tap_execute_digests(w, b.append)
    w.digest_metric(EXECUTE, 1.0)
    w.digest_metric("latency", 0.1)  # not an execute digest
    w.digest_metric(("gather-dep", "busy", "seconds"), 0.1)
    assert a == b == [("inc", "thread-cpu", "seconds", 1.0)]
    undo_b()  # the newer first: the older still taps
    w.digest_metric(EXECUTE, 2.0)
    assert len(a) == 2 and len(b) == 1
    undo_a()
    assert "digest_metric" not in vars(w)  # Dask's own method again
    w.digest_metric(EXECUTE, 4.0)
    assert len(a) == 2 and w.total[EXECUTE] == 7.0  # Dask added every amount all along

    undo_a = _dask.tap_execute_digests(w, a.append)
    undo_b = _dask.tap_execute_digests(w, b.append)
    undo_a()  # the older first: it stops, the newer goes on
    w.digest_metric(EXECUTE, 1.0)
    assert len(a) == 2 and len(b) == 2
    undo_b()
    w.digest_metric(EXECUTE, 1.0)
    assert len(a) == 2 and len(b) == 2 and w.total[EXECUTE] == 9.0


def test_a_scheduler_stopping_runs_the_hook_whether_closed_or_only_stopped():
    import asyncio

    from distributed import Scheduler

    async def attempt():
        stopped, closed = [], []
        scheduler = await Scheduler(host="127.0.0.1", port=0, dashboard_address=":0")
        try:
            _dask.on_stop(scheduler, lambda: stopped.append(1))
            scheduler.stop()  # never closed: distributed's test_nanny.py::test_scheduler_file
            seen_at_stop = len(stopped)
        finally:
            await scheduler.close()
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as scheduler:
            _dask.on_stop(scheduler, lambda: closed.append("undone"))()
            undone = "stop" not in vars(scheduler)
            _dask.on_stop(scheduler, lambda: 1 / 0)  # an error is logged, never in the way of the stop
            _dask.on_stop(scheduler, lambda: closed.append("closed"))
        return seen_at_stop, undone, closed

    with dask_contract("Server.stop() (called by close(), and alone)", "a stopped scheduler leaves our threads"):
        seen_at_stop, undone, closed = asyncio.run(attempt())
        assert seen_at_stop == 1, "stop() alone ran the hook"
        assert undone, "the undo left the hook on the scheduler"
        assert closed == ["closed"], "close() ran the hook (once: nothing stopped it before), not the undone one"


HEARTBEAT = "test-dask-private-heartbeat"


def _add_heartbeat_metrics(dask_worker) -> None:
    dask_worker.influx_test_metrics = {
        HEARTBEAT: lambda worker: {"address": worker.address},
        "managed_bytes": lambda worker: "ours",  # a core metric of that name: Dask's wins
        HEARTBEAT + "-fails": lambda worker: {}[0],  # raises: left out
    }
    for name, fn in dask_worker.influx_test_metrics.items():
        _dask.add_heartbeat_metric(dask_worker, name, fn)


def _remove_heartbeat_metrics(dask_worker) -> bool:
    for name, fn in dask_worker.influx_test_metrics.items():
        _dask.remove_heartbeat_metric(dask_worker, name, fn)
        _dask.remove_heartbeat_metric(dask_worker, name, fn)  # twice: no error
    return not any(n.startswith(HEARTBEAT) for n in dask_worker.metrics)


def _heartbeats(dask_scheduler=None, name=HEARTBEAT) -> list:
    return [(a, seen, m) for a, seen, m in _dask.heartbeats(dask_scheduler, name)]


def _core(dask_scheduler=None) -> list:
    return [
        (ws.metrics.get("managed_bytes"), HEARTBEAT + "-fails" in ws.metrics) for ws in dask_scheduler.workers.values()
    ]


def test_heartbeat_metrics_reach_the_scheduler(client):
    with dask_contract(
        "Worker.metrics (called at each heartbeat into WorkerState.metrics, core metrics first) or "
        "WorkerState.last_seen",
        "the dashboard page gets no figures from the workers and Dask's GPU charts stay blank",
    ):
        client.run(_add_heartbeat_metrics)
        try:
            beats = poll(lambda: all(b[2] is not None for b in client.run_on_scheduler(_heartbeats)))
            assert beats, client.run_on_scheduler(_heartbeats)
            beats = client.run_on_scheduler(_heartbeats)
            assert all(m == {"address": a} and isinstance(seen, float) for a, seen, m in beats), beats
            first = dict((a, seen) for a, seen, _ in beats)
            later = poll(lambda: all(s > first[a] for a, s, _ in client.run_on_scheduler(_heartbeats)), 5)
            assert later, "last_seen does not advance with the heartbeats"
            assert all(isinstance(b, int) and not failed for b, failed in client.run_on_scheduler(_core))
        finally:
            assert all(client.run(_remove_heartbeat_metrics).values())


PAGE = "/individual-test-dask-private"


def _page_doc(scheduler, extra, doc):
    from bokeh.models import Div

    doc.add_root(Div(text=f"page of {scheduler.address}; plots {len(extra['plots'])}"))


def _dashboard(base: str) -> dict:
    with urllib.request.urlopen(base + "/individual-plots.json", timeout=30) as r:
        listed = json.load(r)
    with urllib.request.urlopen(base + PAGE, timeout=30) as r:
        page = r.read().decode()
    with urllib.request.urlopen(base + "/status", timeout=30) as r:
        menu = r.read().decode()
    return {"listed": listed.get("Individual Test Dask Private"), "page": page, "menu": menu}


def _check_dashboard(base: str) -> None:
    got = _dashboard(base)
    assert got["listed"] == PAGE, got["listed"]
    assert "<script" in got["page"] and PAGE.strip("/") + "/ws" in got["page"] or "bokeh" in got["page"], got["page"][
        :500
    ]
    assert f'href="{PAGE.strip("/")}">Test Dask Private<' in got["menu"], "not in the More menu"
    assert got["menu"].count(f'href="{PAGE.strip("/")}"') == 1, "listed twice"


async def _add_page(dask_scheduler=None) -> list:
    return [_dask.add_dashboard_page(dask_scheduler, PAGE, _page_doc) for _ in range(2)]


def test_a_dashboard_page_joins_a_running_scheduler():
    from distributed import Client, LocalCluster

    pytest.importorskip("bokeh")
    with dask_contract(
        "the scheduler's BokehTornado (_applications, routes), template_variables or /individual-plots.json",
        "the GPU Jobs page is missing from the dashboard of a scheduler Monitor.attach() joins",
    ):
        with (
            LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as cluster,
            Client(cluster) as c,
        ):
            assert c.run_on_scheduler(_add_page) == [True, True]
            _check_dashboard(f"http://127.0.0.1:{cluster.scheduler.http_server.port}")
        with (
            LocalCluster(
                n_workers=0,
                processes=False,
                dashboard_address=None,
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            ) as cluster,
            Client(cluster) as c,
        ):
            assert c.run_on_scheduler(_add_page) == [False, False]  # no dashboard: nothing to add to


PRELOAD = """
from dask_influx_metrics import _dask
from test_dask_private import PAGE, _page_doc

async def dask_setup(scheduler):
    _dask.add_dashboard_page(scheduler, PAGE, _page_doc)
"""


def test_a_dashboard_page_from_a_scheduler_preload(tmp_path):
    from distributed import Client

    pytest.importorskip("bokeh")
    (tmp_path / "page_preload.py").write_text(PRELOAD)
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.dirname(__file__)])}
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    command = [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0"]
    command += ["--preload", "page_preload", "--scheduler-file", str(scheduler_file)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with dask_contract(
            "a --preload's dask_setup runs before the dashboard's pages can be added to",
            "`dask scheduler --preload dask_influx_metrics.preload` serves no GPU Jobs page",
        ):
            poll(lambda: scheduler_file.exists() and scheduler_file.read_text().strip(), 60)
            with Client(scheduler_file=str(scheduler_file), timeout=30) as c:
                port = c.scheduler_info()["services"]["dashboard"]
            _check_dashboard(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(30)


def code_lines(path) -> dict:
    """{(line number, line): its names and operators joined, without strings and comments}."""
    lines: dict = {}
    with open(path, "rb") as f:
        for token in tokenize.tokenize(f.readline):
            if token.type in (tokenize.NAME, tokenize.OP):
                where = (token.start[0], token.line.strip())
                lines[where] = lines.get(where, "") + token.string
    return lines


def test_no_private_dask_api_outside_the_dask_module():
    found = []
    for folder, _, files in os.walk(PKG):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != os.path.join(PKG, "_dask.py"):
                found += [
                    f"{os.path.relpath(path, PKG)}:{n}: {line}"
                    for (n, line), code in code_lines(path).items()
                    if PRIVATE.search(code)
                ]
    assert not found, "private Dask APIs belong in dask_influx_metrics/_dask.py only:\n" + "\n".join(found)
