"""Worker plugin: publishes what the worker runs; its host's agent samples (or, ``thread`` mode, it does).

Registered on the scheduler by :func:`..scheduler.session.start` (behind both
``Monitor.start`` and ``--preload``) under the stable name
:data:`..names.WORKER_PLUGIN`, so the scheduler also sets it up on workers that
join later or restart; :func:`..scheduler.session.stop` unregisters it, which
tears it down everywhere. Settings are resolved on the worker from its own Dask
config plus the client's explicit overrides, so each node finds its own Telegraf.

``transition`` (on the event loop) only records the executing tasks with the
job/DAG the scheduler annotated them with (beside the agent in the snapshot it
reads, else in a small in-process registry), and appends one small record per
finished execution for the task stream; transitions that neither start nor end
an execution cost a comparison.

``sampler.mode: agent`` (the default): the worker joins its host's sampling
agent (:mod:`.agentlink`, started if missing), publishes its task starts and
ends to it, wakes it when a task starts on an idle worker, and once a second
publishes the bytes it holds and its clock offset and relays the agent's
reports to the scheduler. Custom metrics and the task stream need the worker
object: they are made here (:mod:`.extras`), on the link's one thread, into the
worker's outbox, and the agent sends them with its own: the host has one
sender. If the agent cannot be started the worker says so and samples
in-process.

``sampler.mode: thread``: one thread in the worker samples its GPUs, its host,
itself, custom metrics and tasks (no coordination with other workers: each
writes its own copy of device and host readings, tagged with its own jobs).

Example
-------
>>> plugin = MetricsWorkerPlugin({}, b"", {"id": "s1", "start": 0.0})
>>> plugin.name
'influx-metrics'
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import socket
import time

from distributed.diagnostics.plugin import WorkerPlugin
from tornado.ioloop import PeriodicCallback

from .. import _dask
from ..clock import SteadyOffset
from ..config import Settings, public
from ..names import ANNOTATION, DESTINATIONS, EVENT_TOPIC, WORKER_PLUGIN, agent_role
from ..notices import Reporter
from ..offloop import off_loop
from ..sampling.host import HostSampling, worker_gpus
from ..sampling.view import WorkerView
from ..schema import GPU, SESSION
from ..sinks.paths import destinations
from . import extras, heartbeat, taskstream
from .custom import CustomSource
from .registry import Both, CachedSnapshot, TaskRecord, TaskRegistry

logger = logging.getLogger(__name__)

FOUND_TIMEOUT = 10.0  # s for the agent to report what it found of this worker's GPUs
RUNNING = frozenset({"executing", "long-running"})
STILL_RUNNING = RUNNING | {"cancelled", "resumed"}  # a cancelled (or resumed) task's thread runs on


class MetricsWorkerPlugin(WorkerPlugin):
    """Publishes this worker's tasks to its host's agent (or samples in-process)."""

    name = WORKER_PLUGIN

    def __init__(self, overrides: dict, worker_payload: bytes, session: dict):
        self.overrides = dict(overrides)
        self.worker_payload = worker_payload
        self.session = dict(session)
        self.link = None  # sampler.mode agent: the link to the host's agent
        self.core = None  # sampler.mode thread: the host-sampling core, for this worker alone
        self.extras = self.tasks = None  # custom metrics, the task stream
        self._write_extras = None  # beside the agent: the extras into the outbox, on the link's thread
        self.gpus, self._uuids = None, []  # the GPUs of per-device custom metrics
        self._untap = None  # takes the tap off Dask's digests (fine metrics)
        self._joining = None  # waits for the agent's first sample of this worker (sampler.mode agent)
        self._heartbeat = None  # the live figures on the worker's heartbeat
        self.closed = False

    def setup(self, worker):
        self.worker = worker
        self.settings = settings = Settings.resolve(self.overrides)
        self.custom = _dask.loads(self.worker_payload) if self.worker_payload else []
        managed = functools.partial(_dask.worker_managed_bytes, worker)  # read by a sampler thread
        brief = settings.sampler_mode == "thread" or bool(self.custom)  # an in-process sampler takes snapshots
        self.registry = TaskRegistry(_dask.worker_nthreads(worker), managed_bytes=managed, brief=brief)
        self._reseed()
        self.snapshot = CachedSnapshot(self.registry)
        self.base_tags = {
            **settings.tags,
            "host": socket.gethostname(),
            "worker": worker.address,
            SESSION: self.session["id"],
        }
        self.report = Reporter(self._event, worker=worker.address, host=self.base_tags["host"])
        # Dask's clock-offset estimate, steadied: it jumps by tens of ms while tasks hold the GIL
        self.offset = SteadyOffset(functools.partial(_dask.worker_clock_offset, worker))
        if taskstream.wanted(settings.fields):
            self.tasks = taskstream.TaskStream(settings.fields, self.base_tags, self.offset, settings.field_tags)
            if self.tasks.fine is not None:  # Dask's execute digests, as it adds them
                self._untap = _dask.tap_execute_digests(worker, self.tasks.fine.added.append)
        self._heartbeat = heartbeat.Heartbeat(worker, self._live)
        if settings.sampler_mode == "agent":
            return self._join_agent()  # awaited by Dask: registered (the agent launched) when setup returns
        self._sample_in_process()

    def _live(self) -> dict | None:
        """This worker's heartbeat entry (:mod:`.heartbeat`): from its agent's beat, or its own sampler's."""
        host = self.base_tags["host"]
        if self.link is not None:
            return heartbeat.from_beat(self.link.beat(), self.link.id, host, time.monotonic())
        core = self.core
        entry = core.figures.entries.get("self") if core is not None else None
        if entry is None:
            return None
        age = round(time.monotonic() - core.figured_at, 2)
        entry = {
            **entry,
            "agent": [host, os.getpid(), core.sampler.samples, age],
            "sinks": heartbeat.sinks(core.sink.counters()),
        }
        return entry if core.figures.accounting is None else {**entry, "acct": core.figures.accounting}

    def _reseed(self) -> None:
        """The registry from the worker's own state, and the record: at setup, and when the agent's record is
        given up."""
        self.record: TaskRecord = self.registry
        self.registry.clear()
        for key in _dask.worker_running_keys(self.worker):
            self._started(key)

    # --- sampler.mode: agent --------------------------------------------------------------
    async def _join_agent(self) -> None:
        """Register with the host's agent, launching it if missing (milliseconds: the worker's start waits for
        this, and for a refusal). Waiting for the agent to sample this worker (its start: a Python process
        importing this package, ~0.2 s) happens beside the worker's start (:meth:`_await_agent`): a cluster
        does not start slower for it. ``Monitor.start()`` still returns once every worker is sampled: it
        waits for each worker's destinations, reported after the agent's first sample of it."""
        from .agentlink import AgentLink

        config = {"settings": dataclasses.asdict(self.settings), "session": self.session["id"]}
        info = {
            "address": self.worker.address,
            "tags": self.base_tags,
            "settings": public(self.settings),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "nthreads": self.registry.nthreads,
            "local_directory": self.worker.local_directory,  # its spill folder is inside: the agent reads its disk
        }
        try:
            link = await off_loop(AgentLink, config, info, self.registry.snapshot(), self.report)
        except PermissionError as e:  # another user's folder in /dev/shm: refused, as a foreign spool root is
            self.report("agent", f"refused to start: {e}")
            if self._untap is not None:  # no activity points from a worker that refused to sample
                self._untap()
            raise
        except Exception as e:
            self.report(
                "agent", f"cannot join this host's sampling agent ({type(e).__name__}: {e}); sampling in-process"
            )
            return self._sample_in_process()
        if self.closed:
            return await off_loop(link.leave, 0)
        self.link, self._relayed = link, (None, 0)  # (agent pid, number of its latest report passed on)
        link.publisher.sync(self.registry.snapshot().running)  # tasks that started or ended while it joined
        if self.custom:  # their registry is kept beside the publisher
            self.record = Both(link.publisher, self.registry)
        else:  # the publisher is the record from now on
            self.registry.clear()
            self.record = link.publisher
        link.publish_from(asyncio.get_running_loop())
        self._publish()
        self._ticker = PeriodicCallback(self._tick, 1000)
        self._ticker.start()
        self._joining = asyncio.ensure_future(self._await_agent(link))

    async def _await_agent(self, link) -> None:
        """Until the agent samples this worker: then where its samples go, and the worker's own points."""
        try:
            found = await off_loop(link.sampled, FOUND_TIMEOUT)
        except Exception as e:  # RuntimeError: the agent cannot see this worker's process
            why = str(e) if isinstance(e, RuntimeError) else f"waiting for the agent failed ({type(e).__name__}: {e})"
            if not self.closed:
                await self._leave_agent(why)
            return
        if self.closed:  # torn down meanwhile: teardown leaves the agent
            return
        self._record_destinations(agent_role(), found)
        if self.custom or self.tasks is not None:
            self._make_extras()
            lines = _refreshing(self.snapshot, self.extras.lines) if self.custom else self.extras.lines
            # the link's thread runs it, into the outbox the agent sends
            self._write_extras = functools.partial(_write, lines, link.outbox)
            seconds, self.extras.custom_every = extras.schedule(
                self.settings, self.tasks is not None, bool(self.custom)
            )
            # no wake for it while the worker runs nothing and has no task points to write (nudged when it starts)
            idle = None if self.custom else (lambda: link.publisher.idle() and not self.extras.pending())
            link.every(seconds, self._write_extras, idle=idle)

    def _publish(self) -> None:
        """Bytes held and the clock offset, which change between the publishes of task starts and ends."""
        self.link.publisher.update(_dask.worker_managed_bytes(self.worker), _dask.worker_clock_offset(self.worker))

    async def _leave_agent(self, why: str) -> None:
        """Sample in-process from now on (the agent cannot serve this worker)."""
        link, self.link = self.link, None
        self._reseed()
        self._ticker.stop()
        self.report("agent", f"{why}; sampling in-process")
        await off_loop(link.leave, 0)
        if self.extras is not None:  # the in-process sampler makes them from now on
            self.extras.stop()
            self._write_extras = self.extras = None
        if self.gpus is not None:  # per-device custom metrics' own: the core opens the GPUs from now on
            self.gpus.close()
            self.gpus, self._uuids = None, []
        if not self.closed:
            self._sample_in_process()

    def _tick(self) -> None:
        if self.link is None:
            return
        if self.link.failed:
            self._leaving = asyncio.ensure_future(self._leave_agent(self.link.failed))
            return
        self._publish()
        beat = self.link.beat()
        if beat and beat.get("relay") == self.link.id:  # one worker per host passes the agent's reports on
            pid, relayed = self._relayed
            for n, event in beat.get("reports", []):
                if n > relayed or beat["pid"] != pid:  # a new agent numbers its reports from 1 again
                    self._relayed = (beat["pid"], n)
                    logger.warning("influx-metrics agent of %s: %s", self.base_tags["host"], event.get("message"))
                    self._event(event)

    # --- sampler.mode: thread (and custom metrics / task stream beside the agent) ------------
    def _sample_in_process(self) -> None:
        """The host-sampling core, for this worker alone (an agent inside the worker)."""
        settings, tags = self.settings, self.base_tags
        self.core = core = HostSampling(
            settings, tags, self.report.once, self._collect_all, name="influx-metrics-sampler"
        )
        info = {
            "address": self.worker.address,
            "pid": os.getpid(),
            "tags": tags,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "local_directory": self.worker.local_directory,
        }
        self.view = WorkerView("self", info, self.snapshot, settings.fields, offset=self.offset)
        found, _ = core.found(self.view)
        self.gpus, self._uuids = core.gpus, self.view.uuids
        if settings.prometheus_port is not None:
            self.report.once(
                "prometheus",
                "prometheus.port: /metrics is served by the host's sampling agent "
                "(sampler.mode: agent); this worker samples in-process and serves none",
            )
        self._record_destinations(self.worker.address, found)
        self._make_extras()
        core.sampler.start()

    def _make_extras(self) -> None:
        """Custom metrics and the task stream, which need the worker object (:mod:`.extras`)."""
        if self.custom and any(m.per_device for m in self.custom) and self.gpus is None:
            info = {"address": self.worker.address, "pid": os.getpid(), "tags": {}}
            view = WorkerView("self", {**info, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}, self.snapshot, ())
            self.gpus, self._uuids = worker_gpus(self.settings, view, self.report.once)
        custom = (
            CustomSource(
                self.custom,
                self.worker,
                self._devices,
                report=self.report,
                timeout=self.settings.polling_interval / 2000.0,
            )
            if self.custom
            else None
        )  # per sample
        self.extras = extras.WorkerExtras(
            custom, self.tasks, self.base_tags, self.snapshot, self.offset, field_tags=self.settings.field_tags
        )

    def _collect_all(self, now_ns: int) -> list:
        self.snapshot.refresh()
        return self.core.sample([self.view], now_ns, final=self.closed) + self.extras.collect(now_ns)

    def _devices(self) -> list:
        """``(device tags, handle)`` per GPU this worker uses, for per-device custom metrics."""
        if self.gpus is None:
            return []
        return [(self.gpus.tags(u, i), self.gpus.handle(u)) for i, u in enumerate(self._uuids)]

    # --- both modes ---------------------------------------------------------------------------
    def teardown(self, worker):
        """Leave the agent (it samples this worker once more) and stop the in-process sampler; the
        awaitable returned (Dask awaits it) does the waiting in a thread, each wait bounded."""
        self.closed = True
        if self._untap is not None:
            self._untap()
        if self._heartbeat is not None:
            self._heartbeat.close()
        link, self.link = self.link, None
        if link is not None:
            self.record = self.registry  # tasks ending from now on no longer go to a publisher that leaves
            self._ticker.stop()
            link.publisher.flush()  # a deferred write now, on the loop: none runs beside leave()'s
            link.stop_waiting()  # an agent still starting is not waited for
        core = self.core if link is None else None  # beside the agent, leave() writes the last points
        return self._teardown(link, core)

    async def _teardown(self, link, core) -> None:
        if self._joining is not None:
            await self._joining  # returns at once: stop_waiting()
        await off_loop(self._close, link, core)

    def _close(self, link, core) -> None:
        if link is not None:
            link.leave()
        if core is not None:  # thread mode: one more sample, the last totals and counters
            core.stop(final_sample=True)
            core.close()
        if self.extras is not None:
            self.extras.stop()
        if self.gpus is not None and core is None:  # the core's are closed with it
            self.gpus.close()

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish in RUNNING and start not in RUNNING:
            self._started(key)
        elif start in STILL_RUNNING and finish not in STILL_RUNNING:
            self._ended(key)

    def _ended(self, key) -> None:
        end = _dask.worker_task_end(self.worker, key)
        if end is not None and end[0] in STILL_RUNNING:
            return  # asked to release a running task: cancelled, its thread runs on
        where = self.record.ended(key)
        if where is not None and self.tasks is not None:
            self.tasks.ended.append((key, *where, end, time.time()))  # the sampler thread does the rest

    def _started(self, key) -> None:
        mark = _dask.worker_task_annotation(self.worker, key, ANNOTATION)
        ours = mark and mark.get("session") == self.session["id"]
        # submitted while no session ran: counted, not attributed
        job, dag = (mark["job"], mark["dag"]) if ours else (0, 0)
        record = self.record
        idle = record.idle()
        record.started(key, job, dag)
        if not idle:
            return
        link = self.link
        if link is not None:
            link.wake()  # the agent samples at once if its last sample saw this worker idle
            link.nudge()  # and the link's thread writes its task points from now on, every 200 ms
        elif self.core is not None and self.extras is not None and not self.snapshot().executing:
            # a graph shorter than the interval still gets a sample; not between back-to-back short
            # tasks (the last sample saw tasks): each is shown at the next tick
            self.core.sampler.wake()

    def _record_destinations(self, role: str, found: dict | None) -> None:
        """Tell the session where this worker's samples go and what it found of its GPUs
        (``Monitor.jobs()["destinations"]``); in thread mode, warn once when GPU metrics were asked
        for and none come (beside an agent, the agent says it once for the host)."""
        where = destinations(self.settings, self.session["id"], role)
        where["gpu"] = found or {"gpu": "unknown", "devices": [], "why": "the sampling agent did not answer"}
        wanted = any(m == GPU for m, _ in self.settings.fields)
        if wanted and self.link is None and where["gpu"]["gpu"] not in ("nvml", "simulated"):
            self.report.once(
                "gpu-source", f"no GPU samples from this worker: {where['gpu']['gpu']} ({where['gpu']['why']})"
            )
        self._event(
            {
                "what": DESTINATIONS,
                "session": self.session["id"],
                "worker": self.worker.address,
                "host": self.base_tags["host"],
                **where,
            }
        )

    def _event(self, event: dict) -> None:
        try:
            self.worker.log_event(EVENT_TOPIC, {"worker": self.worker.address, **event})
        except Exception:  # the event is a courtesy; the log line is the record
            pass


def _refreshing(snapshot, collect):
    def refreshed(now_ns: int) -> list:
        snapshot.refresh()
        return collect(now_ns)

    return refreshed


def _write(lines, outbox) -> int:
    """The worker's own points (custom metrics, the task stream), written into its outbox on the link's
    thread: the agent sends them."""
    return outbox.send(lines(time.time_ns()))


def delivery_counters(dask_worker) -> list[dict]:
    """This worker's sink counters (``Monitor.delivery()``, via ``client.run``): its host agent's (as of its
    latest sample; with those of agents that died), or in thread mode its own sink's; [] when no session
    samples here."""
    plugin = _dask.worker_plugin(dask_worker, WORKER_PLUGIN)
    if plugin is None:
        return []
    if plugin.link is not None:
        return plugin.link.counters()
    return plugin.core.sink.counters() if plugin.core is not None else []
