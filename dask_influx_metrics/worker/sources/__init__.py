"""Sources: where samples come from. Each has ``read() -> list[Reading]``.

GPU sources (``nvml``, ``simulated``) also expose ``handles`` (one per device,
passed to custom metrics) and ``close()``.
"""

from __future__ import annotations

from typing import Protocol

from ...schema import Reading


class Source(Protocol):
    def read(self) -> list[Reading]:
        """Return this moment's readings; one bad field never drops the rest."""


def make_gpu_source(settings, activity, pid: int | None = None):
    """The GPU source that ``influx-metrics.gpu.source`` names, or None.

    ``auto`` is NVML when pynvml imports and sees a device, else no GPU
    source; ``simulated`` follows the worker's activity (see
    :mod:`.simulated`, its UUIDs those of worker process ``pid``, default this
    one); ``none`` turns GPU sampling off.
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
    return NvmlSource(settings.fields)
