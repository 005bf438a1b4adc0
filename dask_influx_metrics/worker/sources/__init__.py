"""Sources: where samples come from. Each has ``read() -> list[Reading]``.

GPU sources (``nvml``, ``simulated``) also expose ``handles`` (one per device,
passed to custom metrics) and ``close()``.
"""

from __future__ import annotations

import os
from typing import Protocol

from ...schema import Reading


class Source(Protocol):
    def read(self) -> list[Reading]:
        """Return this moment's readings; one bad field never drops the rest."""


def make_gpu_source(settings, activity, pid: int | None = None, session_id: str | None = None, report=None,
                    peers=None):
    """The GPU source that ``influx-metrics.gpu.source`` names, or None.

    ``auto`` is NVML when pynvml imports and sees a device, else no GPU
    source; ``simulated`` follows the worker's activity (see
    :mod:`.simulated`, its UUIDs those of worker process ``pid``, default this
    one); ``none`` turns GPU sampling off. NVML reports the GPUs the worker uses
    (``gpu.devices``); with ``session_id``, the workers of a host write each GPU's
    device-wide readings once (:mod:`..gpushare`). ``report(what, message,
    **details)`` is told once of what cannot be done. ``peers``: the sampler's
    :class:`~..gpushare.HostPeers` (then ``session_id`` is not needed).
    """
    choice = settings.gpu_source
    if choice == "none":
        return None
    if choice == "simulated":
        from .simulated import SimulatedGpuSource

        return SimulatedGpuSource(settings.gpu_count, settings.fields, activity, pid=pid)
    from .nvml import NvmlSource, nvml_available

    if choice == "auto" and not nvml_available():
        return None
    report = report or (lambda what, message, **details: None)
    share = {"peers": peers} if peers is not None else {"share_dir": share_dir(session_id, report)}
    source = NvmlSource(settings.fields, devices=settings.gpu_devices, pid=pid, activity=activity, report=report,
                        **share)
    if not source.devices:
        report("gpu-source", "gpu.source is 'nvml' but no GPU is visible to this worker "
               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); no GPU points are written")
    return source


def share_dir(session_id, report) -> str | None:
    """The session's folder in this user's host run directory (one writer per GPU and for the host), or None."""
    if not session_id:
        return None
    from ..gpushare import run_directory

    try:
        return os.path.join(run_directory(), session_id)
    except OSError as e:
        report("gpu-share", f"the workers of this host cannot coordinate ({e}); each worker writes the "
               "host readings and the device-wide readings of the GPUs it uses")
        return None
