"""Scheduler plugin: owns job and DAG identity and the monitoring session.

At each graph submission (``update_graph``) it numbers the DAG, decides its
job, and writes ``{"session", "job", "dag"}`` into each new task's
annotations under :data:`ANNOTATION`. Dask ships annotations to the worker in
the same ``compute-task`` message as the task, so a worker always knows
exactly which job and DAG the tasks it runs belong to, however many clients
submit at once. Nothing is broadcast.

Two messages travel on the client's own batched stream, in order with its
graph submissions: ``update-graph`` (wrapped to learn the submitting task of
graphs submitted from inside tasks, which Dask does not pass to plugins) and
:data:`NEW_JOB_OP` (manual ``new_job()``); the Dask internals for both are in
:mod:`dask_influx_metrics._dask`.

Example
-------
>>> plugin = JobPlugin({"job-type": "manual"}, worker_payload=b"")
>>> plugin.name
'influx-metrics-jobs'
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Callable

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from .. import _dask, lineprotocol, schema
from ..config import Settings
from ..names import (
    ANNOTATION,
    CUSTOM_METRIC,
    DESTINATIONS,
    EVENT_TOPIC,
    JOBS_PLUGIN,
    LIVE_METRIC,
    NEW_JOB_OP,
    SHARED_GPU,
    new_session_id,
)
from ..sinks import HealthWriter, destinations, make_sink
from . import dashboard
from .jobs import JobBook
from .livestate import POLL_S, LiveState

logger = logging.getLogger(__name__)


class JobPlugin(SchedulerPlugin):
    """Counts jobs/DAGs, tags tasks, and holds what any client needs to start or stop."""

    name = JOBS_PLUGIN

    def __init__(self, overrides: dict, worker_payload: bytes, temporary_spool=()):
        self.overrides = dict(overrides)
        self.worker_payload = worker_payload  # pickled custom metrics, opened on workers only
        self.session: dict | None = None
        self.last_session: dict | None = None
        self.book = JobBook(self.overrides.get("job-type", "client"))
        self.sink = None
        self._field_tags: tuple = ()  # tags the dag points write as fields (Settings.field_tags)
        self.health = None  # writes the scheduler sink's delivery counters every ~10 s
        self.shared_gpus: dict[tuple, set] = {}  # (host, uuid) -> worker addresses
        self.destinations: dict[str, dict] = {}  # worker address (or "scheduler") -> where its samples go
        # spool folders written since attach (or the last clear) -> temporary; ``temporary_spool``: those of the
        # plugin this one replaces (attach() again), so shutdown() still deletes them
        self.spooled: dict[str, bool] = dict.fromkeys(temporary_spool, True)
        self.live: LiveState | None = None  # the dashboard page's state: the workers' heartbeat figures

    # --- plugin life cycle -------------------------------------------------
    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self._wrapper = _dask.wrap_update_graph(scheduler)
        _dask.add_stream_handler(scheduler, NEW_JOB_OP, self._handle_new_job)
        self.live = LiveState()
        try:
            dashboard.install(scheduler)
        except Exception as e:  # a Dask or Bokeh that moved what _dask relies on: the page is missing, not the monitor
            logger.warning("influx-metrics: cannot add the GPU Jobs page to the dashboard: %r", e)
        self._poll = PeriodicCallback(self._take_heartbeats, POLL_S * 1000)
        self._poll.start()
        # the poll, the session's threads and files end with the scheduler, also one stopped and never closed
        self._unhook = _dask.on_stop(scheduler, self._stopped)

    def _take_heartbeats(self) -> None:
        self.live.update(_dask.heartbeats(self.scheduler, LIVE_METRIC), time.time())

    def _stopped(self) -> None:
        self._poll.stop()
        self.stop_session()

    async def close(self) -> None:
        _dask.unwrap_update_graph(self.scheduler, self._wrapper)
        _dask.remove_stream_handler(self.scheduler, NEW_JOB_OP, self._handle_new_job)
        self._unhook()
        self._stopped()

    # --- session -----------------------------------------------------------
    def start_session(self, overrides: dict | None = None) -> dict:
        """Begin counting from job/DAG 1; returns the session description. ``overrides``: this
        session's settings (default: attach()'s)."""
        if self.session is not None:
            raise RuntimeError(f"monitoring session {self.session['id']} is already running; stop() it first")
        settings = Settings.resolve(self.overrides if overrides is None else overrides)
        started = time.time()
        sid = new_session_id(started)
        self.book = JobBook(settings.job_type)
        self.session = {"id": sid, "start": started, "job_type": settings.job_type}
        self.live = LiveState()
        self.sink = make_sink(settings, role="scheduler", session=sid)
        self.destinations = {}
        self._record("scheduler", {"host": socket.gethostname(), **destinations(settings, sid, "scheduler")})
        self._tags = {**settings.tags, "host": socket.gethostname(), schema.SESSION: sid}
        self._field_tags = settings.field_tags
        self._last_ns = 0
        self.health = HealthWriter(self.sink, {**self._tags, "worker": "scheduler"}, field_tags=self._field_tags)
        return dict(self.session)

    def stop_session(self) -> dict | None:
        """End the session and close its sink here (the scheduler's own close: nothing to serve any more)."""
        session, close = self.end_session()
        close()
        return session

    def end_session(self) -> tuple[dict | None, Callable[[], None]]:
        """End the session: no later DAG is numbered or written in it. Returns it and what is left to do, the
        final delivery counts written and the sink closed, which waits (bounded) for an InfluxDB that does not
        answer: ``Monitor.stop()`` runs it off the event loop (:func:`..offloop.off_loop`)."""
        session, self.session = self.session, None
        health, sink, self.health, self.sink = self.health, self.sink, None, None
        if session is not None:
            session["stop"] = time.time()
            self.last_session = session

        def close() -> None:
            if health is not None:
                health.stop()  # the final counts, before the sink closes
            if sink is not None:
                sink.close()

        return session, close

    def _record(self, who: str, where: dict) -> None:
        self.destinations[who] = where = {**where, "sinks": list(where["sinks"])}  # events arrive with tuples
        if where.get("spool"):
            self.spooled[where["spool"]] = bool(where.get("temporary"))

    def clear(self) -> tuple[list, list]:
        """``clear_metrics()``: later reads start now; returns (spool folders to empty, those a running
        session still writes to, which are kept) and forgets all but the latter."""
        now = time.time()
        for session in (self.session, self.last_session):
            if session is not None:
                session["cleared"] = now
        running = sorted(d["spool"] for d in self.destinations.values() if d.get("spool")) if self.session else []
        folders, self.spooled = sorted(self.spooled), {f: self.spooled[f] for f in running}
        return folders, running

    def state(self) -> dict:
        """What a client needs: settings overrides, session, jobs and DAGs."""
        return {
            "overrides": dict(self.overrides),
            "worker_payload": self.worker_payload,
            "session": dict(self.session) if self.session else None,
            "last_session": dict(self.last_session) if self.last_session else None,
            "destinations": {w: dict(d) for w, d in self.destinations.items()},
            "temporary_spool": sorted(f for f, temporary in self.spooled.items() if temporary),
            "shared_gpus": [
                {"host": h, "uuid": u, "workers": sorted(w)} for (h, u), w in sorted(self.shared_gpus.items())
            ],
            **self.book.summary(),
        }

    # --- Dask hooks ----------------------------------------------------------
    def update_graph(self, scheduler, *, client, keys, tasks, annotations=None, stimulus_id=None, **kwargs):
        if self.session is None:
            return
        sid = self.session["id"]
        parent = _dask.parent_task_key()
        parent_job = None
        if parent is not None and parent in scheduler.tasks:
            mark = (scheduler.tasks[parent].annotations or {}).get(ANNOTATION) or {}
            parent_job = mark.get("job") if mark.get("session") == sid else None
        new = []
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is not None and ((ts.annotations or {}).get(ANNOTATION) or {}).get("session") != sid:
                new.append(ts)
        dag = self.book.submit(client, [ts.key for ts in new], now=time.time(), parent_job=parent_job)
        mark = {"session": sid, "job": dag.job, "dag": dag.number}
        for ts in new:  # copy: Dask may share one annotations dict between tasks
            ts.annotations = {**(ts.annotations or {}), ANNOTATION: mark}
        self._write_dag(dag, "submit")
        if dag.ended is not None:
            self._write_dag(dag, "end")

    def transition(self, key, start, finish, *args, **kwargs):
        if self.session is None or finish not in ("memory", "erred", "forgotten"):
            return
        # a pending task forgotten before reaching memory or erred never finished: cancelled
        dag = self.book.task_done(key, erred=finish == "erred", cancelled=finish == "forgotten", now=time.time())
        if dag is not None:
            self._write_dag(dag, "end")

    def _handle_new_job(self, client=None, job=None, label=None, **kwargs):
        try:
            number = self.book.new_job(job, label)
            logger.info("influx-metrics: client %s started manual job %s", client, number)
        except ValueError as e:
            logger.warning("influx-metrics: new_job from %s refused: %s", client, e)

    def _write_dag(self, dag, event: str) -> None:
        if self.sink is None:
            return
        fields = {
            "dag": str(dag.number),
            "status": dag.status,
            "event": event,
            "tasks": dag.ntasks,
            "label": dag.label,
        }
        if event == "end":
            fields["duration"] = float(dag.ended - dag.submitted)
        t = dag.submitted if event == "submit" else dag.ended
        # dag and status are fields, so the DAGs of a job share one series: two points at one
        # nanosecond would overwrite each other. Times strictly increase (+1 ns on a collision).
        self._last_ns = max(int(t * 1e9), self._last_ns + 1)
        point = schema.Point(schema.DAG, {**self._tags, "job": str(dag.job)}, fields, self._last_ns)
        self.sink.send(lineprotocol.encode_many([lineprotocol.tags_as_fields(point, self._field_tags)]))

    def log_event(self, topic, msg) -> None:
        """Collect the workers' shared-GPU reports (``Monitor.jobs()["shared_gpus"]``), destinations and the
        first failure of each custom metric (the session's ``failed_metrics``: readers name it)."""
        if topic != EVENT_TOPIC or not isinstance(msg, dict):
            return
        if msg.get("what") == DESTINATIONS and self.session is not None and msg.get("session") == self.session["id"]:
            self._record(msg["worker"], {k: v for k, v in msg.items() if k not in ("what", "session", "worker")})
        elif msg.get("what") == CUSTOM_METRIC and self.session is not None:
            self.session.setdefault("failed_metrics", {}).setdefault(
                str(msg.get("metric")), {"worker": msg.get("worker"), "message": msg.get("message")}
            )
        elif msg.get("what") == SHARED_GPU:
            # from the host's agent, relayed by a worker: every worker using the GPU is named
            self.shared_gpus.setdefault((msg.get("host"), msg.get("uuid")), set()).update(
                msg.get("workers") or [msg.get("worker")]
            )
