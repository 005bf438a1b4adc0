"""Every private or undocumented Dask API this package touches: one small function each.

No other module may use these Dask internals; ``tests/test_dask_private.py``
exercises each function against the installed Dask and fails with "distributed
X changed <what>: <what breaks>" when a release moves one, and it checks that
no other module reaches for them. ``pyproject.toml`` bounds ``dask`` and
``distributed`` above by the newest release those tests passed on.

Checked against distributed 2026.8.0 and 2026.7.1 (the release RAPIDS 26.10
pins); ``scripts/test.sh`` runs the Dask-facing tests on both.

Public Dask API, used directly elsewhere and not wrapped here: the
``SchedulerPlugin``/``WorkerPlugin`` hooks; ``Client.register_plugin`` and
``run_on_scheduler``; ``Scheduler.add_plugin``, ``remove_plugin``, ``plugins``
and ``address``; ``Scheduler.tasks`` and the scheduler's ``TaskState.annotations``
(documented scheduler state); ``Worker.address`` and ``Worker.log_event``.

Example
-------
>>> loads(dumps(lambda x: x + 1))(1)
2
"""

from __future__ import annotations

import contextvars
import functools
import logging
from typing import Callable

from distributed.protocol import pickle as _pickle

logger = logging.getLogger(__name__)

# --- scheduler: the client's graph stream ------------------------------------
# Scheduler.stream_handlers["update-graph"] receives the client's raw message;
# its "submitting_task" field (the key of the task that submitted the graph, from
# inside a worker_client) is not passed to SchedulerPlugin.update_graph. Without it,
# graphs submitted from inside tasks start a job of their own instead of joining
# their parent's job. Checked: distributed 2026.8.0, 2026.7.1.
_submitting = contextvars.ContextVar("influx_metrics_submitting_task", default=None)
_ORIGINAL = "_influx_metrics_original"


def wrap_update_graph(scheduler):
    """Make :func:`parent_task_key` answer inside ``update_graph`` hooks; returns the wrapper (or None)."""
    current = scheduler.stream_handlers.get("update-graph")
    original = getattr(current, _ORIGINAL, current)  # never wrap a wrapper
    if original is None:
        return None

    async def update_graph(**msg):
        token = _submitting.set(msg.get("submitting_task"))
        try:
            return await original(**msg)
        finally:
            _submitting.reset(token)

    setattr(update_graph, _ORIGINAL, original)
    scheduler.stream_handlers["update-graph"] = update_graph
    return update_graph


def unwrap_update_graph(scheduler, wrapper) -> None:
    """Undo :func:`wrap_update_graph` if ``wrapper`` is still the installed handler."""
    if wrapper is not None and scheduler.stream_handlers.get("update-graph") is wrapper:
        scheduler.stream_handlers["update-graph"] = getattr(wrapper, _ORIGINAL)


def parent_task_key():
    """The key of the task that submitted the graph being handled, or None (client code)."""
    return _submitting.get()


# Scheduler.stream_handlers (op -> handler of the client's batched stream) and
# Client._send_to_scheduler (puts a message on that stream). Together they carry
# Monitor.new_job() in order with the client's graph submissions; without them
# new_job() fails, or (sent any other way) can overtake a graph still in the
# stream and put it in the wrong job. Checked: distributed 2026.8.0, 2026.7.1.
def add_stream_handler(scheduler, op: str, handler) -> None:
    """Handle messages ``{"op": op, ...}`` from clients' batched streams with ``handler(client=..., **msg)``."""
    scheduler.stream_handlers[op] = handler


def remove_stream_handler(scheduler, op: str, handler) -> None:
    """Remove the handler of ``op`` if it is still ``handler`` (a bound method compares equal to itself)."""
    if scheduler.stream_handlers.get(op) == handler:
        scheduler.stream_handlers.pop(op)


def send_on_client_stream(client, msg: dict) -> None:
    """Send ``msg`` on ``client``'s batched stream, ordered with its graph submissions."""
    client._send_to_scheduler(msg)


# --- scheduler: worker plugins -------------------------------------------------
# Scheduler.register_worker_plugin(comm, plugin_bytes, name, idempotent) and
# Scheduler.unregister_worker_plugin(comm, name) are the comm handlers behind
# Client.register_plugin / unregister_worker_plugin; called directly they are the
# only way to add or remove a worker plugin from the scheduler itself (--preload,
# and the one start/stop path in scheduler/session.py). Without them no worker
# samples anything, or sampling never stops. A worker's failure comes back as an
# error reply (status "error", exception_text), not as an exception.
# Checked: distributed 2026.8.0, 2026.7.1.
async def add_worker_plugin(scheduler, plugin, name: str) -> None:
    """Set ``plugin`` up on every worker now and on every worker that joins later.

    A worker's setup error is raised as ``RuntimeError`` naming the worker and the error.
    """
    replies = await scheduler.register_worker_plugin(None, dumps(plugin), name=name, idempotent=False)
    _raise_worker_error(replies, f"could not set up worker plugin {name!r}")


async def remove_worker_plugin(scheduler, name: str) -> bool:
    """Tear plugin ``name`` down on every worker; False if it was not registered.

    A worker's teardown error is raised as ``RuntimeError`` naming the worker and the error.
    """
    if name not in scheduler.worker_plugins:
        return False
    _raise_worker_error(
        await scheduler.unregister_worker_plugin(None, name), f"could not tear down worker plugin {name!r}"
    )
    return True


def _raise_worker_error(replies: dict, what: str) -> None:
    failed = {addr: reply.get("exception_text") for addr, reply in replies.items() if reply.get("status") == "error"}
    if failed:
        raise RuntimeError(
            f"{what} on {len(failed)} worker(s): "
            + "; ".join(f"{addr}: {text}" for addr, text in sorted(failed.items()))
        )


# --- scheduler: its end ---------------------------------------------------------
# Server.stop(): what a scheduler runs as it ends, from close() and also alone (a scheduler ended with
# stop() and never closed, as distributed's own test_nanny.py::test_scheduler_file does); a
# SchedulerPlugin's close() runs only from close(). Overridden on the instance, as a method Dask
# calls on itself (self.stop()). Without it a stopped scheduler leaves the session's threads
# (delivery health, the spool's flush timer, the HTTP sink's writer) and open files behind.
# Checked: distributed 2026.8.0, 2026.7.1.
def on_stop(server, fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn()`` when ``server`` stops (its ``stop()``, which ``close()`` calls too: a server stopped, then
    closed calls it twice), before Dask's own stop; returns the undo. An exception from ``fn`` is logged, never
    in the way of the stop."""

    def cover(original, live):
        def stop(*args, **kwargs):
            if live["live"]:
                try:
                    fn()
                except Exception:
                    logger.exception("influx-metrics: stopping with %s failed", type(server).__name__)
            return original(*args, **kwargs)

        return stop

    return _cover(server, "stop", cover)


def _cover(obj, name: str, cover) -> Callable[[], None]:
    """Set ``obj.<name>`` on the instance to ``cover(original, live)``: a method Dask calls on itself, seen
    through ours. Returns the undo, which puts back what it covered or, covered since by another, makes
    ``live["live"]`` False so ours stops acting (the other keeps calling through it; a dict, not a call: the
    tap's cover looks at it per digest)."""
    covered = vars(obj).get(name)  # another cover's, else None: the class's method
    state = {"live": True}
    mine = cover(getattr(obj, name), state)
    setattr(obj, name, mine)

    def undo() -> None:
        state["live"] = False
        if vars(obj).get(name) is mine:
            if covered is None:
                delattr(obj, name)
            else:
                setattr(obj, name, covered)

    return undo


# --- pickling --------------------------------------------------------------------
# distributed.protocol.pickle: pickle with a cloudpickle fallback, the format
# Worker.plugin_add loads. Without it custom metrics defined in a notebook or as
# closures cannot travel to the workers, and worker plugins registered from the
# scheduler would not load there. Checked: distributed 2026.8.0, 2026.7.1.
def dumps(obj) -> bytes:
    return _pickle.dumps(obj)


def loads(data: bytes):
    return _pickle.loads(data)


# --- worker: its state machine ------------------------------------------------------
# Worker.state (a WorkerState: nthreads, nbytes, executing, long_running, tasks)
# is Dask's internal worker state machine. Without it the worker plugin cannot
# size its task registry, count managed bytes, see the tasks already running
# when sampling starts, or read the job/DAG annotation of a task, so samples
# lose their job and dag tags. Checked: distributed 2026.8.0, 2026.7.1.
def worker_nthreads(worker) -> int:
    return worker.state.nthreads


def worker_managed_bytes(worker) -> int:
    """Bytes of task results the worker holds (read from any thread)."""
    return worker.state.nbytes


def worker_running_keys(worker) -> list:
    """Keys of the tasks executing now, including long-running (seceded) ones."""
    return [ts.key for ts in list(worker.state.executing) + list(worker.state.long_running)]


def worker_task_annotation(worker, key, name: str):
    """Annotation ``name`` of task ``key`` on this worker (None if unknown).

    The scheduler's ``TaskState.annotations`` as they stood when it sent the task:
    what ``SchedulerPlugin.update_graph`` wrote there arrives with the task.
    """
    ts = worker.state.tasks.get(key)
    return (ts.annotations or {}).get(name) if ts is not None else None


# Worker.scheduler_delay: scheduler clock minus this worker's, refreshed each
# heartbeat; what Dask adds to its own worker timestamps. Undocumented. Without it
# the workers' samples are not aligned on one clock. Checked: distributed 2026.8.0, 2026.7.1.
def worker_clock_offset(worker) -> float:
    return worker.scheduler_delay


# Worker.plugins (name -> WorkerPlugin instance): where a worker keeps the plugins set
# up on it; not documented. Without it Monitor.delivery() cannot read the sinks'
# delivery counters. Checked: distributed 2026.8.0.
def worker_plugin(worker, name: str):
    """The plugin set up on ``worker`` under ``name``, or None."""
    return worker.plugins.get(name)


# WorkerState.tasks[key] (state, prefix, startstops, nbytes): what a task's execution ended
# in, read on the event loop by WorkerPlugin.transition as it ends. startstops are Dask's
# per-task intervals ({"action": "compute"|"transfer"|"disk-read"|"disk-write", "start",
# "stop"}; compute and transfer already on the scheduler's clock, disk ones on the worker's).
# Without it the task stream has no timings, sizes or final state. Checked: distributed 2026.8.0, 2026.7.1.
def worker_task_end(worker, key):
    """``(state, prefix, startstops, nbytes)`` of task ``key`` now, or None when forgotten."""
    ts = worker.state.tasks.get(key)
    return None if ts is None else (ts.state, ts.prefix, tuple(ts.startstops), ts.nbytes)


# Worker.digest_metric(name, amount): where a worker adds each of Dask's fine performance metrics;
# its state machine calls self.digest_metric(("execute", span_id, prefix, activity, unit), amount)
# when a task's execution ends, so an instance attribute over the method sees every one. Without it
# there are no activity points. Checked: distributed 2026.8.0, 2026.7.1.
def tap_execute_digests(worker, append) -> Callable[[], None]:
    """Also ``append((prefix, activity, unit, amount))``, on the event loop, for each execute digest the
    worker adds from now on; returns the undo (which puts back what it covered, or, with a tap set over
    ours since, only stops ours)."""

    def cover(original, live):
        def digest_metric(name, value):
            original(name, value)
            # Dask's other digests (transfers, ticks) are looked at first: one type check
            if type(name) is tuple and len(name) == 5 and name[0] == "execute" and live["live"]:
                append((name[2], name[3], name[4], value))

        return digest_metric

    return _cover(worker, "digest_metric", cover)


# --- worker: heartbeat metrics ------------------------------------------------------------
# Worker.metrics (name -> fn(worker), a public Worker(metrics=...) parameter kept as a plain dict) is
# called at each heartbeat; what it returns lands in the scheduler's WorkerState.metrics[name]. A core
# metric of the same name (Dask's own GPU figures when its NVML sees a device) wins over ours, and an
# entry that raises is left out of that heartbeat. Without it the dashboard page gets no figures and
# Dask's GPU charts stay blank where its NVML is off. Checked: distributed 2026.8.0, 2026.7.1.
def add_heartbeat_metric(worker, name: str, fn: Callable) -> None:
    worker.metrics[name] = fn


def remove_heartbeat_metric(worker, name: str, fn: Callable) -> None:
    """Remove ``name`` if it is still ``fn`` (another plugin may have replaced it)."""
    if worker.metrics.get(name) is fn:
        del worker.metrics[name]


# Scheduler.workers[address] (WorkerState: host, last_seen: the scheduler's time of its latest
# heartbeat, metrics: what that heartbeat carried). Without it the dashboard page has nothing to show.
# Checked: distributed 2026.8.0, 2026.7.1.
def heartbeats(scheduler, name: str) -> list[tuple[str, float, object]]:
    """``(address, last_seen, metrics[name] or None)`` per worker, as of its latest heartbeat."""
    return [(address, ws.last_seen, ws.metrics.get(name)) for address, ws in list(scheduler.workers.items())]


# --- scheduler: the dashboard ---------------------------------------------------------------
# distributed.dashboard.scheduler builds one BokehTornado from its `applications` table (path ->
# doc(scheduler, extra, doc)) when the scheduler starts, after --preload modules are imported; its
# "More" menu lists the memoized template_variables(scheduler)["plots"], and /individual-plots.json
# the app_paths of the first BokehTornado in scheduler.http_application.applications. A plugin
# attached to a running scheduler (Monitor.attach) comes too late for the table, so a page is added to
# the running BokehTornado the way its __init__ adds each one: an ApplicationContext in _applications
# and bokeh's per-application routes (page, websocket, metadata, autoload, static). Without it the
# GPU-per-job page is missing from the dashboard. Checked: distributed 2026.8.0 (bokeh 3.9), 2026.7.1.
def add_dashboard_page(scheduler, path: str, doc: Callable) -> bool:
    """Serve ``doc(scheduler, extra, document)`` at ``path`` on the scheduler's running dashboard, list it
    in the "More" menu and in ``/individual-plots.json``; False when the scheduler has no dashboard (no
    bokeh, or ``dashboard=False``). Adding a path twice keeps the first."""
    try:
        from bokeh.application import Application
        from bokeh.application.handlers.document_lifecycle import DocumentLifecycleHandler
        from bokeh.application.handlers.function import FunctionHandler
        from bokeh.server.contexts import ApplicationContext
        from bokeh.server.tornado import BokehTornado, create_static_handler
        from bokeh.server.urls import per_app_patterns
        from bokeh.server.views.ws import WSHandler
        from distributed.dashboard.scheduler import template_variables
    except ImportError:
        return False
    http = getattr(scheduler, "http_application", None)
    tornado = next((a for a in getattr(http, "applications", ()) if isinstance(a, BokehTornado)), None)
    if tornado is None:
        return False
    if path in tornado._applications:
        return True
    variables = template_variables(scheduler)  # memoized: the very dict every page's menu reads
    extra = {"prefix": tornado.prefix + "/", **variables}
    app = Application(FunctionHandler(functools.partial(doc, scheduler, extra)), DocumentLifecycleHandler())
    context = ApplicationContext(app, url=path)
    context._loop = tornado._loop
    routes = [(tornado.prefix + path + p[0], p[1], {"application_context": context}) for p in per_app_patterns]
    websocket = next(r[0] for r in routes if r[0].endswith("/ws"))
    for route in routes:
        route[2]["bokeh_websocket_path"] = websocket
        if issubclass(route[1], WSHandler):
            route[2].update(compression_level=None, mem_level=None)
    tornado._applications[path] = context
    tornado.add_handlers(r".*", [*routes, create_static_handler(tornado.prefix, path, app)])
    name = " ".join(path.strip("/").split("-")[1:]).title().replace("Gpu", "GPU")
    plots = variables["plots"]
    if not any(p["url"] == path.strip("/") for p in plots):
        plots.append({"url": path.strip("/"), "name": name})
        plots.sort(key=lambda p: p["name"])
    return True
