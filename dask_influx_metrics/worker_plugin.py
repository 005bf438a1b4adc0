"""Worker plugin: wires sources -> sampler -> sink on each worker.

Registered by :meth:`Monitor.start` with ``Client.register_plugin`` under the
stable name :data:`PLUGIN_NAME`, so the scheduler also sets it up on workers
that join later or restart; :meth:`Monitor.stop` unregisters it, which tears
it down everywhere. Settings are resolved on the worker from its own Dask
config plus the client's explicit overrides, so each node finds its own
Telegraf.

``transition`` (on the event loop) only updates a small registry of executing
tasks with the job/DAG the scheduler annotated them with; the sampling thread
does everything else.

Example
-------
>>> plugin = MetricsWorkerPlugin({}, b"", {"id": "s1", "start": 0.0})
>>> plugin.name
'influx-metrics'
"""

from __future__ import annotations

import logging
import socket

from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol.pickle import loads

from .config import Settings
from .sampler import Sampler
from .scheduler_plugin import ANNOTATION
from .sinks import make_sink
from .sources import make_gpu_source
from .sources.activity import CachedActivity, TaskRegistry, TaskSource
from .sources.custom import CustomSource
from .sources.host import HostSource

logger = logging.getLogger(__name__)

PLUGIN_NAME = "influx-metrics"
EVENT_TOPIC = "influx-metrics"
RUNNING = frozenset({"executing", "long-running"})
STILL_RUNNING = RUNNING | {"cancelled"}  # a cancelled task's thread runs on


class MetricsWorkerPlugin(WorkerPlugin):
    """Samples this worker every ``polling-interval`` ms on a daemon thread."""

    name = PLUGIN_NAME

    def __init__(self, overrides: dict, worker_payload: bytes, session: dict):
        self.overrides = dict(overrides)
        self.worker_payload = worker_payload
        self.session = dict(session)
        self.sampler = None

    def setup(self, worker) -> None:
        self.worker = worker
        settings = Settings.resolve(self.overrides)
        self.registry = TaskRegistry(worker.state.nthreads, managed_bytes=lambda: worker.state.nbytes)
        for ts in list(worker.state.executing) + list(worker.state.long_running):
            self._started(ts.key)
        custom = loads(self.worker_payload) if self.worker_payload else []
        activity = CachedActivity(self.registry)
        self.gpu = self._gpu_source(settings, activity, needed=any(m.per_device for m in custom))
        sources = [s for s in (
            self.gpu,
            HostSource(settings.fields),
            TaskSource(settings.fields, activity),
            CustomSource(custom, worker, self._devices, report=self._report),
        ) if s is not None]
        self.sink = make_sink(settings, role=worker.address, session=self.session["id"])
        base = {**settings.tags, "host": socket.gethostname(), "worker": worker.address}

        def tags() -> dict:
            snap = activity()
            return {**base, "job": snap.job_tag, "dag": snap.dag_tag}

        self.sampler = Sampler(
            sources, self.sink, tags, interval=settings.polling_interval / 1000.0,
            before_sample=activity.refresh, clock_offset=lambda: worker.scheduler_delay,
        )
        self.sampler.start()

    def teardown(self, worker) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sink.close()
            if self.gpu is not None:
                self.gpu.close()
            self.sampler = None

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish in RUNNING and start not in RUNNING:
            self._started(key)
        elif finish not in STILL_RUNNING:
            self.registry.finished(key)

    def _started(self, key) -> None:
        ts = self.worker.state.tasks.get(key)
        mark = (ts.annotations or {}).get(ANNOTATION) if ts is not None else None
        if mark and mark.get("session") == self.session["id"]:
            self.registry.started(key, mark["job"], mark["dag"])
        else:  # submitted while no session ran: counted, not attributed
            self.registry.started(key, 0, 0)

    def _gpu_source(self, settings: Settings, activity, needed: bool):
        if not needed and not any(m == "gpu" for m, _ in settings.fields):
            return None
        try:
            return make_gpu_source(settings, activity)
        except Exception as e:  # e.g. gpu.source=nvml on a node without a driver
            self._report("gpu-source", f"GPU source {settings.gpu_source!r} unavailable: {e}")
            return None

    def _devices(self) -> list:
        """(device tags, handle) pairs for per-device custom metrics."""
        if self.gpu is None:
            return []
        return [({"index": str(i), "uuid": uuid, "name": name}, h)
                for (i, uuid, name), h in zip(self.gpu.devices, self.gpu.handles)]

    def _report(self, what: str, message: str) -> None:
        logger.warning("influx-metrics on %s: %s", self.worker.address, message)
        try:
            self.worker.log_event(EVENT_TOPIC, {"worker": self.worker.address, "what": what, "message": message})
        except Exception:  # the event is a courtesy; the log line above is the record
            pass
