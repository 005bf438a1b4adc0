"""Worker plugin: samples each worker (sources -> sampler -> sink, wired by :mod:`.build`).

Registered on the scheduler by :func:`..scheduler.session.start` (behind both
``Monitor.start`` and ``--preload``) under the stable name :data:`..names.WORKER_PLUGIN`,
so the scheduler also sets it up on workers that join later or restart;
:func:`..scheduler.session.stop` unregisters it, which tears it down
everywhere. Settings are resolved on the worker from its own Dask config plus
the client's explicit overrides, so each node finds its own Telegraf.

``transition`` (on the event loop) only updates a small registry of executing
tasks with the job/DAG the scheduler annotated them with, and appends one small
record per finished execution for the task stream (:mod:`.sources.taskstream`);
the sampler does everything else. Transitions that neither start nor end an
execution cost a comparison.

With ``sampler.isolate`` (``isolate``, the default) a sidecar process samples,
out of the worker's GIL (see :mod:`.sidecar`); when a task starts or ends the
worker publishes the change to it (a few microseconds, :mod:`.shared`), and
when a task starts on an idle worker, wakes it. Custom metrics and the task
stream need the ``worker`` object, so they keep an in-process sampler of their
own (``custom``, ``task`` and ``activity`` points only, same tags, timestamps
from their own clock ticks). If the sidecar cannot start or dies, that is
reported once and the worker samples in-process as with ``isolate: false``; so
does a sidecar that produces no sample for 3 polling intervals + 0.5 s (hung).

Example
-------
>>> plugin = MetricsWorkerPlugin({}, b"", {"id": "s1", "start": 0.0})
>>> plugin.name
'influx-metrics'
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time

from tornado.ioloop import PeriodicCallback

from distributed.diagnostics.plugin import WorkerPlugin

from .. import _dask
from ..config import Settings
from ..names import ANNOTATION, DESTINATIONS, EVENT_TOPIC, WORKER_PLUGIN
from .build import build_sampler
from .clock import SteadyOffset
from ..sinks import counters, destinations
from .sources import taskstream
from .sources.activity import CachedActivity, TaskRegistry

logger = logging.getLogger(__name__)

SIDECAR_START_TIMEOUT = 30.0  # s for a sidecar to start sampling (it imports this package)
STALL_MARGIN = 0.5  # s: a sidecar whose latest sample is 3 intervals + this old is hung (checked once a second)
RUNNING = frozenset({"executing", "long-running"})
STILL_RUNNING = RUNNING | {"cancelled", "resumed"}  # a cancelled (or resumed) task's thread runs on


class MetricsWorkerPlugin(WorkerPlugin):
    """Samples this worker every ``polling-interval`` ms on a daemon thread."""

    name = WORKER_PLUGIN

    def __init__(self, overrides: dict, worker_payload: bytes, session: dict):
        self.overrides = dict(overrides)
        self.worker_payload = worker_payload
        self.session = dict(session)
        self.sampler = None
        self.sidecar = None  # sampler.isolate: the sidecar process while it samples
        self.tasks = None  # the task stream (set up in setup when tracked)
        self.closed = False

    def setup(self, worker):
        self.worker = worker
        self.settings = settings = Settings.resolve(self.overrides)
        managed = functools.partial(_dask.worker_managed_bytes, worker)  # read by the sampler thread
        self.registry = TaskRegistry(_dask.worker_nthreads(worker), managed_bytes=managed)
        for key in _dask.worker_running_keys(worker):
            self._started(key)
        self.custom = _dask.loads(self.worker_payload) if self.worker_payload else []
        self.activity = CachedActivity(self.registry)
        self.base_tags = {**settings.tags, "host": socket.gethostname(), "worker": worker.address}
        # Dask's clock-offset estimate, steadied: it jumps by tens of ms while tasks hold the GIL
        self.offset = SteadyOffset(functools.partial(_dask.worker_clock_offset, worker))
        self.tasks = taskstream.TaskStream(
            settings.fields, self.base_tags, self.offset,
            digests=functools.partial(_dask.worker_digests, worker)) if taskstream.wanted(settings.fields) else None
        self.gpu = self.sink = None
        self._record_destinations()
        if settings.isolate:
            return self._setup_isolated()  # awaited by Dask: sampling has begun when start() returns
        self._start_sampler()

    def _start_sampler(self, custom_only: bool = False) -> None:
        """The in-process sampler: everything, or (beside a sidecar) custom metrics only."""
        self.sampler, (self.gpu, self.sink) = build_sampler(
            self.settings, self.session["id"], self.worker.address, self.base_tags, self.activity,
            clock_offset=self.offset, report=self._report,
            custom=self.custom, worker=self.worker, custom_only=custom_only, gpu=self.gpu, sink=self.sink,
            streams=() if self.tasks is None else (self.tasks,),
        )
        self.sampler.start()

    def teardown(self, worker):
        """Stop sampling; the awaitable returned (Dask awaits it) joins and flushes in a thread,
        each wait bounded, so the worker's event loop never waits on a sink or a metric."""
        self.closed = True
        sidecar, self.sidecar = self.sidecar, None
        if sidecar is not None:
            self._ticker.stop()
        sampler, self.sampler = self.sampler, None
        # a graph that ended after the last sample still leaves one (the in-process sampler samples all);
        # so do tasks that ended since then (task stream)
        final = sampler is not None and (sidecar is None and self.registry.unsampled()
                                         or self.tasks is not None and self.tasks.pending())
        return asyncio.to_thread(self._close, sidecar, sampler, self.sink, self.gpu, final)

    @staticmethod
    def _close(sidecar, sampler, sink, gpu, final: bool = False) -> None:
        if sidecar is not None:
            sidecar.close()  # it flushes its own sink
        if sampler is not None:
            sampler.stop(final_sample=final)
            sink.close()
            if gpu is not None:
                gpu.close()

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish in RUNNING and start not in RUNNING:
            self._started(key)
        elif start in STILL_RUNNING and finish not in STILL_RUNNING:
            self._ended(key)

    def _ended(self, key) -> None:
        end = _dask.worker_task_end(self.worker, key)
        if end is not None and end[0] in STILL_RUNNING:
            return  # asked to release a running task: cancelled, its thread runs on
        where = self.registry.finished(key)
        if self.sidecar is not None:
            self.sidecar.publisher.ended(key)
        if where is not None and self.tasks is not None:
            self.tasks.ended.append((key, *where, end, time.time()))  # the sampler thread does the rest

    def _started(self, key) -> None:
        mark = _dask.worker_task_annotation(self.worker, key, ANNOTATION)
        ours = mark and mark.get("session") == self.session["id"]
        # submitted while no session ran: counted, not attributed
        idle = self.registry.idle()
        job, dag = (mark["job"], mark["dag"]) if ours else (0, 0)
        self.registry.started(key, job, dag)
        if self.sidecar is not None:
            self.sidecar.publisher.started(key, job, dag)
            if idle:
                self.sidecar.wake()  # it samples at once if its last sample saw no task
        if idle and self.sampler is not None and not self.activity().executing:
            # a graph shorter than the interval still gets a sample; not between back-to-back short
            # tasks (the last sample saw tasks): each is shown at the next tick, as the sampler's docs say
            self.sampler.wake()

    # --- sampler.isolate: the sidecar process (see worker/sidecar.py) ------------------------
    async def _setup_isolated(self) -> None:
        from .sidecar import Sidecar  # not at import: `python -m` runs that module in the sidecar

        try:
            self.sidecar = sidecar = Sidecar(self.settings, self.session["id"], self.worker.address, self.base_tags,
                                             self.registry.snapshot())  # its first sample sees the tasks running now
        except Exception as e:
            self._report("sidecar", f"cannot start the sampling sidecar ({type(e).__name__}: {e}); sampling in-process")
        else:
            # once a second: bytes held and the clock offset also change between transitions; liveness
            self._ticker = PeriodicCallback(self._tick, 1000)
            self._publish()
            if not await asyncio.to_thread(sidecar.wait_ready, SIDECAR_START_TIMEOUT):
                if self.sidecar is sidecar:  # else teardown took it meanwhile
                    self.sidecar = None
                    code = await asyncio.to_thread(sidecar.close)
                    self._report("sidecar", f"the sampling sidecar did not start (exit code {code}); sampling in-process")
            elif self.sidecar is sidecar:
                self._ticker.start()
        if not self.closed and (self.sidecar is None or self.custom or self.tasks is not None):
            self._start_sampler(custom_only=self.sidecar is not None)

    def _publish(self) -> None:
        """Bytes held and the clock offset, which change between the publishes of task starts and ends."""
        self.sidecar.publisher.update(_dask.worker_managed_bytes(self.worker), _dask.worker_clock_offset(self.worker))

    def _tick(self) -> None:
        if self.sidecar is None:
            return
        code, stalled = self.sidecar.poll(), self.sidecar.stalled_for()
        if code is None and stalled < 3 * self.settings.polling_interval / 1000.0 + STALL_MARGIN:
            self._publish()
            return
        what = f"exited with code {code}" if code is not None else f"produced no sample for {stalled:.1f} s (hung)"
        self._report("sidecar", f"the sampling sidecar (pid {self.sidecar.pid}) {what}; sampling in-process from now on")
        self._ticker.stop()
        sidecar, self.sidecar = self.sidecar, None
        sidecar.proc.kill()  # a hung one ignores the pipe and SIGTERM
        self._reaping = asyncio.ensure_future(asyncio.to_thread(sidecar.close, 0))  # reaps it, off the loop
        if self.sampler is not None:  # the custom-only sampler: replaced by a full one
            self.sampler.stop()
        self._start_sampler()

    # --- end of sampler.isolate --------------------------------------------------------

    def _record_destinations(self) -> None:
        """Tell the session on the scheduler where this worker's samples go (``Monitor.jobs()["destinations"]``)."""
        where = destinations(self.settings, self.session["id"], self.worker.address)
        self.worker.log_event(EVENT_TOPIC, {"what": DESTINATIONS, "session": self.session["id"],
                                            "worker": self.worker.address, "host": self.base_tags["host"], **where})

    def _report(self, what: str, message: str, **details) -> None:
        logger.warning("influx-metrics on %s: %s", self.worker.address, message)
        event = {**details, "worker": self.worker.address, "host": self.base_tags["host"], "what": what, "message": message}
        try:
            self.worker.log_event(EVENT_TOPIC, event)
        except Exception:  # the event is a courtesy; the log line above is the record
            pass


def delivery_counters(dask_worker) -> list[dict]:
    """This worker's sink counters (``Monitor.delivery()``, via ``client.run``): its sidecar's
    (as of its latest sample), then those of the worker's own sink (in-process sampling, or
    custom metrics and the task stream beside a sidecar); [] when no session samples here."""
    plugin = _dask.worker_plugin(dask_worker, WORKER_PLUGIN)
    sidecar, sink = getattr(plugin, "sidecar", None), getattr(plugin, "sink", None)
    return (sidecar.counters() if sidecar is not None else []) + (counters(sink) if sink is not None else [])
