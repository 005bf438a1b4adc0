"""One function wires a sampler (sources, sink, common tags) for the worker plugin and the sidecar.

In the worker (:mod:`.plugin`): GPU, host, task and custom sources, or custom
metrics only when a sidecar samples the rest. In the sidecar (:mod:`.sidecar`):
GPU, host (of the worker's ``process``) and task sources; no custom metrics,
they need the worker object.

Example
-------
>>> from dask_influx_metrics.config import Settings
>>> from dask_influx_metrics.worker.sources.activity import CachedActivity, TaskRegistry
>>> activity = CachedActivity(TaskRegistry(nthreads=2))
>>> settings = Settings.resolve({"sink": "udp", "gpu.source": "none"})
>>> sampler, parts = build_sampler(settings, "s1", "tcp://w:1", {"host": "h", "worker": "tcp://w:1"},
...                                activity, clock_offset=lambda: 0.0, report=print)
>>> sampler._tags()
{'host': 'h', 'worker': 'tcp://w:1', 'job': '0', 'dag': '0'}
>>> sampler.stop(); parts.sink.close()
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..schema import GPU, WORKER
from .sampler import Sampler
from ..sinks import make_sink
from .sources import make_gpu_source, share_dir
from .sources.activity import TaskSource
from .sources.custom import CustomSource
from .sources.host import HostSource, refresh_seconds


class Parts(NamedTuple):
    """What the sampler's owner closes after ``sampler.stop()``, or hands to the next sampler."""

    gpu: object | None  # the GPU source, also the device handles of per-device custom metrics
    sink: object


def build_sampler(
    settings,
    session_id: str,
    worker_address: str,
    base_tags: dict,
    activity,
    *,
    clock_offset: Callable[[], float],
    report: Callable[..., None],
    process=None,
    custom: list | None = None,
    worker=None,
    custom_only: bool = False,
    gpu=None,
    sink=None,
    streams: tuple = (),
) -> tuple[Sampler, Parts]:
    """A sampler, not yet started, and the parts it holds.

    ``activity`` is the snapshot reader (``refresh()`` before each sample, then
    ``activity()``); every point gets ``base_tags`` plus its ``job``/``dag``.
    ``clock_offset()``: seconds to add to timestamps. ``report(what, message, **details)``:
    how a problem is told (a GPU source that cannot start). ``process``: the
    worker's ``psutil.Process`` when sampling from outside it (the sidecar). Each
    sampler publishes its worker's activity in the session's host-local folder
    once per sample (:class:`.gpushare.HostPeers`, keyed by the worker's pid);
    from there the owner of a GPU and the host's writer tag device- and host-wide
    points with the jobs of every worker concerned. The ``host`` measurement is
    written by one sampler per host and session (the holder of ``host.lock``,
    :mod:`.gpushare`) with ``sampler.host-once`` (the default), unless only host
    fields are tracked (then every worker writes its own: it has no other rows);
    its counters are read every ``sampler.host-refresh`` ms.
    ``custom``: custom metrics, called as ``fn(worker, ...)``; ``None`` for none.
    ``custom_only``: custom metrics only (beside a sidecar); the GPU source is
    still opened when a per-device metric needs its handles. ``gpu`` and
    ``sink``: reuse these instead of making new ones (``gpu=None``: make one if
    needed). ``streams``: objects whose ``points(now_ns)`` join each sample (the
    worker's task stream, :mod:`.sources.taskstream`), also beside a sidecar.
    """
    per_device = any(m.per_device for m in custom or ())
    pid = None if process is None else process.pid
    # beside a sidecar (custom_only) nothing joins the host share: the sidecar's sampler does
    peers = None if custom_only else _peers(share_dir(session_id, report), pid, report)
    if gpu is None and (per_device or not custom_only and any(m == GPU for m, _ in settings.fields)):
        try:
            gpu = make_gpu_source(settings, activity, pid=pid, report=report, peers=peers)
        except Exception as e:  # e.g. gpu.source=nvml on a node without a driver
            report("gpu-source", f"GPU source {settings.gpu_source!r} unavailable: {e}")
    refresh = refresh_seconds(settings.host_refresh, settings.polling_interval)
    # once per host only where every worker writes samples of its own (its rows, that host columns join)
    once = settings.host_once and any(m in (GPU, WORKER) for m, _ in settings.fields)
    host = None if custom_only else HostSource(settings.fields, process=process, refresh=refresh,
                                               peers=peers if once else None)
    sources = [] if custom_only else [s for s in (gpu, host, TaskSource(settings.fields, activity)) if s is not None]
    if custom is not None:
        sources.append(CustomSource(custom, worker, lambda: device_handles(gpu), report=report,
                                    timeout=settings.polling_interval / 2000.0))  # deadline per sample
    if sink is None:  # sends keep the GIL in the worker's process, not in a sidecar (process given)
        sink = make_sink(settings, role=worker_address, session=session_id, report=report, hold_gil=process is None)

    def tags() -> dict:
        snap = activity()
        return {**base_tags, "job": snap.job_tag, "dag": snap.dag_tag}

    before = activity.refresh if peers is None else _publishing(activity, peers, report)
    sampler = Sampler(sources, sink, tags, interval=settings.polling_interval / 1000.0,
                      before_sample=before, clock_offset=clock_offset, owned=tuple(p for p in (host, peers) if p),
                      streams=streams, field_tags=() if settings.dag_tag else ("dag",))
    return sampler, Parts(gpu, sink)


def _peers(directory, pid, report):
    """This sampler's :class:`.gpushare.HostPeers` in ``directory``, or None (none, or it cannot be made)."""
    if directory is None:
        return None
    from .gpushare import HostPeers

    try:
        return HostPeers(directory, pid)
    except OSError as e:
        report("gpu-share", f"the workers of this host cannot coordinate ({e}); each worker writes the "
               "host readings and the device-wide readings of the GPUs it uses")
        return None


def _publishing(activity, peers, report) -> Callable[[], None]:
    """``before_sample``: take the sample's activity snapshot, then publish it for the host's owners."""
    failed = []

    def before() -> None:
        activity.refresh()
        try:
            peers.publish_activity(activity())
        except Exception as e:  # never costs the sample; the owners then see this worker's previous state
            if not failed:
                failed.append(e)
                report("gpu-share", f"cannot publish this worker's activity to the host's other workers: {e!r}")

    return before


def device_handles(gpu) -> list:
    """``(device tags, handle)`` per device of a GPU source, for per-device custom metrics."""
    if gpu is None:
        return []
    return [({"index": str(i), "uuid": uuid, "name": name}, h) for (i, uuid, name), h in zip(gpu.devices, gpu.handles)]
