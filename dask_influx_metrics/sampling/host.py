"""The host-sampling core: everything that samples a host, built in one place from the settings.

The host's agent process (:mod:`..agent.process`) builds one for all the workers of the host; a worker
sampling in-process (``sampler.mode: thread``) builds the same one for itself alone: an agent inside the
worker. It opens the GPUs (:func:`.gpus.open_gpus`), builds the host and disk sources, the per-job
:mod:`.accounting`, the :class:`~.collect.HostCollector`, the live figures (:mod:`.live`), the sink and
its :class:`~..sinks.sender.Sender` (the delivery points), and the drift-free :class:`~.sampler.Sampler`
whose ``collect`` the owner gives: the agent's looks at its run folder first, the worker's adds its
custom metrics and task stream. The owner keeps what only it knows (the run folder, the worker object);
nothing under ``worker/`` builds a sampler, a sink, a GPU source or a collector itself.
"""

from __future__ import annotations

import socket
import time
from typing import Callable

from ..names import GpuState
from ..schema import SESSION, Point
from ..sinks import make_sink
from ..sinks.sender import Sender
from . import accounting
from .collect import HostCollector
from .gpus import gpm_found, open_gpus
from .live import LIVE_S, LiveFigures
from .sampler import Sampler
from .sources.host import host_sources
from .view import WorkerView


class HostSampling:
    """The sampling of one host's GPUs, host and worker processes (see the module docstring).

    ``tags``: the sampler's own (``worker``: its role, the agent's or the worker's address; ``session``);
    ``report(what, message, **details)``: told once of what cannot be known; ``collect(now_ns)``: the
    sampler's (see :class:`~.sampler.Sampler`), which calls :meth:`sample`; ``paths``: filesystems read
    beside the workers' own (the agent's run folder); ``serve``: per-job totals kept for ``/metrics``;
    ``sample_on_wake``: a wake's sample is taken on the waking thread (the agent's wake listener).
    """

    def __init__(
        self,
        settings,
        tags: dict,
        report,
        collect: Callable,
        *,
        name: str,
        paths=(),
        serve: bool = False,
        sample_on_wake: bool = False,
    ):
        self.settings = settings
        self.gpus, self.gpu_state, self.gpu_why = open_gpus(settings, report=report)
        self._report = report
        host, disks = host_sources(settings)
        own = {"host": socket.gethostname(), "worker": tags["worker"], SESSION: tags[SESSION]}
        self.accounting = accounting.from_settings(settings, own, report=report, serve=serve)
        self.collector = HostCollector(
            settings.fields, self.gpus, host, disks, paths=tuple(paths), accounting=self.accounting
        )
        self.figures, self.figured_at = LiveFigures(), -LIVE_S  # the latest figures of each worker
        self.sink = make_sink(settings, role=own["worker"], session=own[SESSION], report=report)
        self.sender = Sender(self.sink, {**settings.tags, **own}, settings.field_tags)
        self.sampler = Sampler(
            collect,
            self.sender,
            settings.polling_interval / 1000.0,
            name=name,
            field_tags=settings.field_tags,
            sample_on_wake=sample_on_wake,
        )

    def found(self, view: WorkerView) -> tuple[dict, GpuState]:
        """What this host's GPUs are to ``view`` (its ``uuids`` set from its ``CUDA_VISIBLE_DEVICES``):
        ``({"gpu": state, "devices": [...], "why": ..., "gpm": {...}}, state)``, as the session records it."""
        state, why = self.gpu_state, self.gpu_why
        if self.gpus is not None:
            try:
                view.uuids = self.gpus.resolve(view)
            except Exception as e:  # a malformed CUDA_VISIBLE_DEVICES, NVML failing
                state, why = GpuState.ERROR, f"{type(e).__name__}: {e}"
            if state == GpuState.NVML and not view.uuids:
                state, why = (
                    GpuState.NONE_VISIBLE,
                    f"no GPU is visible to this worker (CUDA_VISIBLE_DEVICES={view.visible!r})",
                )
        found = {"gpu": state.value, "devices": list(view.uuids), "why": why}
        if gpm := gpm_found(self.gpus, view.uuids, self._report):
            found["gpm"] = gpm
        return found, state

    def sample(self, views: list, now_ns: int, final: bool = False) -> list[Point]:
        """One sample of ``views`` (:meth:`.collect.HostCollector.collect`); each worker's live figures
        refreshed every :data:`~.live.LIVE_S`, its peaks observed in between."""
        points = self.collector.collect(views, now_ns, final=final)
        if (now := time.monotonic()) - self.figured_at >= LIVE_S:
            self.figured_at = now
            self.figures.update(views, points, now, self.collector.shared)
            self.figures.account(self.accounting.live() if self.accounting is not None else None)
        else:
            self.figures.observe(points, now)
        return points

    def stop(self, final_sample: bool = False) -> None:
        """The sampler stopped (after one more sample with ``final_sample``); the session's last per-job
        totals sent (no later point carries them)."""
        self.sampler.stop(final_sample=final_sample)
        if self.accounting is not None:
            accounting.repeat(self.accounting.close(), self.sender.send, self.settings.field_tags)

    def close(self) -> None:
        """The sink's last delivery counts sent, the sink closed, the GPUs let go (after :meth:`stop` and
        the owner's last sends)."""
        self.sender.health_now()
        self.sender.send([])
        self.sink.close()
        if self.gpus is not None:
            self.gpus.close()


def worker_gpus(settings, view: WorkerView, report):
    """The GPUs a worker uses, opened in the worker for its per-device custom metrics beside the agent:
    ``(backend or None, uuids)``; no devices when they cannot be resolved (NVML's own report says why)."""
    gpus, _, _ = open_gpus(settings, report=report)
    if gpus is None:
        return None, []
    try:
        return gpus, gpus.resolve(view)
    except Exception:
        return gpus, []
