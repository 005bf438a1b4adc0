"""The host's GPUs for one sampler: opened once, and what each worker found (a named state).

:func:`open_gpus` picks the backend ``gpu.source`` names: :class:`.sources.nvml.NvmlDevices`
(NVML initialised once per agent, whatever the number of workers) or
:class:`SimulatedDevices`; or none, with the :class:`~..names.GpuState` that
says why. Both backends answer ``resolve(worker) -> [uuid, ...]``,
``tags(uuid, index)``, ``start_sample(final)``, ``read(uuid)``, ``read_worker(uuid,
pid, shared)``, ``gpm_state(uuid)``, ``handle(uuid)`` and ``close()``.

Example
-------
>>> from dask_influx_metrics.config import Settings
>>> gpus, state, why = open_gpus(Settings.resolve({"gpu.source": "none"}))
>>> gpus, state.value
(None, 'off')
"""

from __future__ import annotations

from ..names import GpuState
from ..schema import GPU
from .sources.simulated import NAME, SimulatedGpuSource


class SimulatedDevices:
    """``gpu.count`` simulated GPUs per worker, each following its worker's snapshot (:mod:`.sources.simulated`)."""

    def __init__(self, count: int, fields: frozenset):
        self._count, self._fields = count, fields
        self._by_uuid: dict[str, tuple] = {}  # uuid -> (source, position)
        self._readings: dict = {}  # id(source) -> this sample's readings
        self._final = False  # this sample is a worker's last: the counters are read now

    def resolve(self, worker) -> list[str]:
        source = SimulatedGpuSource(self._count, self._fields, worker.snapshot, pid=worker.pid)
        for i, (_, uuid, _) in enumerate(source.devices):
            self._by_uuid[uuid] = (source, i)
        return [uuid for _, uuid, _ in source.devices]

    def tags(self, uuid: str, index: int) -> dict:
        return {"index": str(index), "uuid": uuid, "name": NAME}

    def start_sample(self, final: bool = False) -> None:
        self._readings, self._final = {}, final

    def read(self, uuid: str) -> dict:
        source, i = self._by_uuid[uuid]
        if id(source) not in self._readings:
            self._readings[id(source)] = source.read(self._final)
        readings = self._readings[id(source)]
        return dict(readings[i].fields) if readings else {}

    def read_worker(self, uuid: str, pid: int, shared: bool = False) -> dict:
        return {}

    def gpm_state(self, uuid: str) -> None:
        return None  # simulated devices have no GPM

    def handle(self, uuid: str):
        source, i = self._by_uuid[uuid]
        return source.handles[i]

    def forget(self, uuids) -> None:
        for uuid in uuids:
            self._by_uuid.pop(uuid, None)

    def close(self) -> None:
        self._by_uuid = {}


def open_gpus(settings, report=None, nvml=None) -> tuple[object | None, GpuState, str]:
    """``(backend or None, state, why)`` for ``settings.gpu_source``; never raises.

    ``auto`` is NVML when pynvml imports and NVML starts, else no GPU (state and
    reason kept, so that workers can say what they found). ``report(what,
    message)``: told of fields that cannot be known (per-worker GPU memory in a
    PID namespace).
    """
    wanted = any(m == GPU for m, _ in settings.fields)
    if settings.gpu_source == "none":
        return None, GpuState.OFF, "gpu.source is 'none'"
    if settings.gpu_source == "simulated":
        return SimulatedDevices(settings.gpu_count, settings.fields), GpuState.SIMULATED, ""
    from .sources.nvml import NvmlDevices, Pace

    try:
        return (
            NvmlDevices(
                settings.fields if wanted else frozenset(),
                settings.gpu_devices,
                nvml=nvml,
                report=report,
                pace=Pace.of(settings),
            ),
            GpuState.NVML,
            "",
        )
    except ImportError as e:
        return None, GpuState.NO_NVML, str(e)
    except Exception as e:  # RuntimeError: NVML could not start (no driver, no GPU)
        return None, GpuState.NO_DRIVER, str(e)


def gpm_found(gpus, uuids, report) -> dict:
    """``{uuid: GpmState value}`` of the devices where GPM fields are wanted (recorded with a worker's
    destinations); ``report(what, message, key=...)`` hears once per reason why a device gives none."""
    found = {}
    for uuid in uuids if gpus is not None else ():
        if (gpm := gpus.gpm_state(uuid)) is None:
            continue
        state, why = gpm
        found[uuid] = state.value
        if why:
            report(
                "gpm",
                f"GPM metrics (sm_active, sm_occupancy, tensor, DRAM, ...) were asked for, but GPU {uuid} "
                f"gives none: {state.value} ({why}); said once per reason",
                key=("gpm", state, why),
                state=state.value,
                uuid=uuid,
            )
    return found
