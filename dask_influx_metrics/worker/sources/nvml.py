"""GPU readings from NVML (``import pynvml``, from the ``nvidia-ml-py`` package).

One ``gpu`` reading per device the worker uses, tagged ``index`` (position in
``CUDA_VISIBLE_DEVICES``, 0 = first visible), ``nvml_index`` (the physical GPU),
``uuid`` and ``name``. Device-wide fields come only from the worker that owns
the GPU on its host, tagged with the jobs of every worker that uses it
(:mod:`..gpushare`); per-worker fields (``per_worker`` entries: the memory this
worker's process tree holds, :mod:`.gpuprocs`) from every worker. Only the
requested fields are read. :data:`TABLE` holds one entry per NVML call: its
variants, best first, and how each field it serves follows from the result,
in the unit of ``schema.FIELDS``. One call per device and sample serves every
field of its entry (one utilization call for both utilization fields);
``static`` fields are read when the device opens (``memory_total``).

Adding a field is one entry here (plus its line in ``schema.FIELDS``), e.g. the
clock event reasons, with the name pynvml had before 12.535 as fallback::

    "clock_events": Group(
        (Call("nvmlDeviceGetCurrentClocksEventReasons"),
         Call("nvmlDeviceGetCurrentClocksThrottleReasons")),
        {"clocks_event_reasons": int},  # NVML's bitmask, as is
    ),

Errors are per entry and per device. Only NVML saying the device or driver
cannot (NotSupported, NoPermission, FunctionNotFound, ArgumentVersionMismatch)
moves on to the next variant of the call (memory v2 -> v1), then switches the
entry off on that device for good: a MIG instance, which has no per-instance
utilization, simply has no utilization fields. A variant whose function,
constant or keyword this pynvml lacks is left out when the source opens (by
name, never by catching ``AttributeError``). Any other error, from NVML or
from the conversion (a result missing an attribute, a bug), omits those
fields from this sample only and is logged once per device and entry or
field; the next sample tries again. A reading is never dropped for one
failing field.

NVML is initialised once per process (keyed by ``os.getpid()`` as distributed
does, so a forked worker initialises again) and never shut down per sample.

Which devices: see :mod:`.nvml_devices`.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Callable, NamedTuple

from ...schema import GPU, Reading
from .gpuprocs import ProcessTree, host_pid_problem, tree_memory_mib
from .nvml_devices import (  # noqa: F401  (nvml_available: also imported from here)
    ENV as _ENV, as_text, choose, import_nvml, init_once, nvml_available, parse_visible, visible_handles,
)

logger = logging.getLogger(__name__)



def _mib(nbytes) -> float:
    return nbytes / 2**20


class Call(NamedTuple):
    """One variant of an NVML call: ``nvml.<function>(handle, *args, **keywords)``.

    ``args`` and the keyword values name pynvml constants.
    """

    function: str
    args: tuple[str, ...] = ()
    keywords: tuple[tuple[str, str], ...] = ()

    def names(self) -> tuple[str, ...]:
        """The pynvml names this variant needs."""
        return (self.function, *self.args, *(v for _, v in self.keywords))


class Group(NamedTuple):
    """One NVML call per device and sample, and the fields its result gives.

    ``calls``: the variants, best first. ``fields``: field -> its value from the
    result, in the unit of ``schema.FIELDS`` (``None``: no value this time).
    ``static``: fields read once per device and kept. ``per_worker``: the
    fields describe this worker, not the device; each converter then also gets
    the worker's process ids (host PIDs).
    """

    calls: tuple[Call, ...]
    fields: dict[str, Callable]
    static: frozenset = frozenset()
    per_worker: bool = False


TABLE: dict[str, Group] = {
    "utilization": Group(
        (Call("nvmlDeviceGetUtilizationRates"),),
        {"utilization_gpu": lambda u: float(u.gpu), "utilization_memory": lambda u: float(u.memory)},
    ),
    "memory": Group(  # v2 does not count reserved memory as used; bytes -> MiB
        (Call("nvmlDeviceGetMemoryInfo", keywords=(("version", "nvmlMemory_v2"),)),
         Call("nvmlDeviceGetMemoryInfo")),
        {"memory_used": lambda m: _mib(m.used),
         "memory_used_percent": lambda m: 100.0 * m.used / m.total if m.total else None,
         "memory_total": lambda m: _mib(m.total) if m.total else None},
        static=frozenset({"memory_total"}),
    ),
    "power": Group((Call("nvmlDeviceGetPowerUsage"),), {"power_draw": lambda mw: mw / 1000.0}),  # mW -> W
    "temperature": Group(
        (Call("nvmlDeviceGetTemperatureV", ("NVML_TEMPERATURE_GPU",)),
         Call("nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",))),
        {"temperature_gpu": float},  # C
    ),
    "clock": Group((Call("nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",)),), {"clocks_current_sm": float}),  # MHz
    "clock_memory": Group(  # ~1 us on an H100
        (Call("nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",)),), {"clocks_current_memory": float}),  # MHz
    "pstate": Group((Call("nvmlDeviceGetPerformanceState"),), {"pstate": int}),  # ~1 us; 0 (P0, fastest) to 15
    # Video engines: [percent, sampling period in us] each; the period is NVML's, not ours
    "encoder": Group((Call("nvmlDeviceGetEncoderUtilization"),), {"utilization_encoder": lambda u: float(u[0])}),
    "decoder": Group((Call("nvmlDeviceGetDecoderUtilization"),), {"utilization_decoder": lambda u: float(u[0])}),
    "jpeg": Group((Call("nvmlDeviceGetJpgUtilization"),), {"utilization_jpeg": lambda u: float(u[0])}),
    "ofa": Group((Call("nvmlDeviceGetOfaUtilization"),), {"utilization_ofa": lambda u: float(u[0])}),
    "clock_events": Group(  # 1-3 us on an H100; the older name before pynvml 12.535
        (Call("nvmlDeviceGetCurrentClocksEventReasons"), Call("nvmlDeviceGetCurrentClocksThrottleReasons")),
        {"clocks_event_reasons": int},  # NVML's bitmask, as is
    ),
    "processes": Group(  # ~32 us on an H100: pid and usedGpuMemory of each process with a context
        (Call("nvmlDeviceGetComputeRunningProcesses"),),
        {"worker_memory_used": tree_memory_mib},  # MiB
        per_worker=True,
    ),
}


def _takes(fn, keywords) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read: let NVML answer
        return True
    return all(k in params for k, _ in keywords) or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _variants(nvml, group: Group) -> list[Callable]:
    """The group's calls this pynvml can make, bound to their constants: ``call(handle)``."""
    bound = []
    for call in group.calls:
        fn = getattr(nvml, call.function, None)
        missing = [n for n in call.names() if getattr(nvml, n, None) is None]
        if missing or not _takes(fn, call.keywords):
            logger.debug("pynvml lacks %s: %s variant skipped", missing or call.keywords, call.function)
            continue
        args = tuple(getattr(nvml, a) for a in call.args)
        kwargs = {k: getattr(nvml, v) for k, v in call.keywords}
        bound.append(lambda handle, fn=fn, args=args, kwargs=kwargs: fn(handle, *args, **kwargs))
    if not bound:
        logger.info("this pynvml has none of %s: %s not read", [c.function for c in group.calls],
                    "/".join(group.fields))
    return bound


class _Device:
    __slots__ = ("index", "handle", "tags", "static", "calls")

    def __init__(self, index, handle, uuid, name, calls, nvml_index=None):
        self.index = index
        self.handle = handle
        self.tags = {"index": str(index), "uuid": uuid, "name": name}
        if nvml_index is not None:
            self.tags["nvml_index"] = str(nvml_index)
        self.static: dict = {}  # static fields read so far (memory_total)
        self.calls = calls  # TABLE key -> remaining variants of its NVML call


class NvmlSource:
    """``gpu`` readings for the devices this process may use.

    ``fields`` holds ``(measurement, field)`` pairs (see ``schema.FIELDS``); only
    the ``gpu`` ones are read. ``visible`` defaults to ``CUDA_VISIBLE_DEVICES``;
    ``nvml`` is the pynvml module (imported when ``None``); ``devices`` is
    ``gpu.devices`` (see :func:`.nvml_devices.choose`). ``pid`` is the worker's
    process id (default: this process). ``share_dir`` (the session's folder in
    the host's run directory) turns on one writer per physical GPU among the
    workers of the host, and ``activity`` (a callable returning the worker's
    :class:`~.activity.Activity`) is what this worker publishes there;
    ``peers`` (the sampler's :class:`~..gpushare.HostPeers`, which publishes this
    worker's activity once per sample) replaces ``share_dir``; without it this
    source publishes on its own. ``report(what, message, **details)`` is told,
    once, of shared GPUs and of per-worker memory that cannot be known. NVML that cannot start raises
    ``RuntimeError``.

    >>> src = NvmlSource(frozenset({("gpu", "utilization_gpu")}), visible="")  # no GPU visible
    >>> src.devices, src.read()
    ([], [])

    On a GPU, ``src.read()[0]`` is e.g. ``Reading('gpu', {'index': '0', 'uuid':
    'GPU-9baca7f5-...', 'name': 'NVIDIA A100-SXM4-80GB'}, {'utilization_gpu': 87.0})``.
    """

    def __init__(self, fields: frozenset, visible=_ENV, nvml=None, *, devices: str = "all", pid: int | None = None,
                 share_dir: str | None = None, activity=None, report=None, peers=None):
        self._nvml = nvml = import_nvml(nvml)
        self._visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is _ENV else visible
        self._mode, self._activity = devices, activity
        self._share_dir = peers if peers is not None else share_dir  # HostDevices takes either
        self._report_to = report or (lambda what, message, **details: logger.warning("%s", message))
        self._tree = ProcessTree(pid)
        self._share = None
        self._shared_reported: set[str] = set()
        self._samples = 0
        want = frozenset(name for m, name in fields if m == GPU)
        problem = host_pid_problem() if want & _worker_fields() else None
        if problem:
            self._report_to("gpu-process-memory", f"per-worker GPU memory left out: {problem}")
            want -= _worker_fields()
        self._want = want
        # per TABLE entry with a wanted field: (key, group, per-sample fields, static fields)
        self._plan = [
            (key, g, [f for f in g.fields if f in want and f not in g.static], [f for f in g.static if f in want])
            for key, g in TABLE.items() if want.intersection(g.fields)
        ]
        self._reported: set[tuple[int, str]] = set()
        self._unsupported = tuple(  # NVML's own "this device or driver cannot"
            e for e in (
                nvml.NVMLError_NotSupported,
                nvml.NVMLError_NoPermission,
                nvml.NVMLError_FunctionNotFound,
                getattr(nvml, "NVMLError_ArgumentVersionMismatch", None),  # absent from older pynvml
            ) if e is not None
        )
        self._devices: list[_Device] = []
        self._open()

    def _open(self) -> None:
        nvml = self._nvml
        entries = parse_visible(self._visible)  # ValueError before touching NVML
        self._pid = os.getpid()
        self._devices = []
        if entries == []:  # CUDA_VISIBLE_DEVICES="": nothing to read, NVML not needed
            return
        try:
            init_once(nvml)
            handles = visible_handles(nvml, entries)
        except nvml.NVMLError as e:
            raise RuntimeError(
                f"NVML could not start ({e}); is the NVIDIA driver installed and a GPU "
                "present? Without one, set influx-metrics.gpu.source to 'simulated' or 'none'."
            ) from e
        handles = choose(handles, self._mode, visible_set=entries is not None)
        variants = {key: _variants(nvml, g) for key, g, _, _ in self._plan}
        for index, handle in enumerate(handles):
            uuid = self._static(nvml.nvmlDeviceGetUUID, handle, f"GPU-unknown-{index}")
            name = self._static(nvml.nvmlDeviceGetName, handle, "unknown")
            physical = _nvml_index(nvml, handle)
            dev = _Device(index, handle, uuid, name, {key: list(v) for key, v in variants.items()}, physical)
            self._fields(dev, static_only=True)
            self._devices.append(dev)
        if self._share_dir and self._devices:
            from ..gpushare import HostDevices

            self._share = HostDevices(self._share_dir, [d.tags["uuid"] for d in self._devices], pid=self._tree.pid)

    def _static(self, fn, handle, default: str) -> str:
        try:
            return as_text(fn(handle)) or default
        except self._nvml.NVMLError as e:
            logger.warning("NVML %s failed (%s); using %r", fn.__name__, e, default)
            return default

    def _fields(self, dev: _Device, static_only: bool = False, per_worker: bool = False) -> dict:
        """The wanted device-wide (or ``per_worker``) fields of ``dev`` now; static ones read only
        until they have a value."""
        fields: dict = {}
        for key, group, per_sample, static in self._plan:
            if group.per_worker != per_worker:
                continue
            todo = [f for f in static if f not in dev.static] + ([] if static_only else per_sample)
            raw = self._call(dev, key, group) if todo else None
            if raw is None:
                continue
            extra = (self._tree.pids(),) if per_worker else ()
            for name in todo:
                try:
                    value = group.fields[name](raw, *extra)
                except Exception as e:  # a result unlike the documented one, or a bug: this sample only
                    self._report(dev, name, e)
                    continue
                if value is not None:
                    (dev.static if name in static else fields)[name] = value
        return fields if per_worker else {**fields, **dev.static}

    def _call(self, dev: _Device, key: str, group: Group):
        """The entry's NVML result for ``dev``, or ``None`` (never raises)."""
        variants = dev.calls[key]
        while variants:
            try:
                return variants[0](dev.handle)
            except self._unsupported as e:
                variants.pop(0)
                if not variants:
                    logger.info(
                        "GPU %d (%s): %s not available (%s: %s); omitted from now on",
                        dev.index, dev.tags["uuid"], "/".join(group.fields), type(e).__name__, e,
                    )
            except Exception as e:  # any other NVML error, or a bug: this sample only
                self._report(dev, "/".join(group.fields), e)
                return None
        return None

    def _report(self, dev: _Device, what: str, error: Exception) -> None:
        if (dev.index, what) in self._reported:
            return
        self._reported.add((dev.index, what))
        logger.warning(
            "GPU %d (%s): reading %s failed (%s: %s); omitted from this sample (reported once)",
            dev.index, dev.tags["uuid"], what, type(error).__name__, error,
            exc_info=None if isinstance(error, self._nvml.NVMLError) else error,  # a bug: where
        )

    def read(self) -> list[Reading]:
        """One ``gpu`` reading per visible device with the requested fields."""
        if not self._want or not self._devices:
            return []
        if os.getpid() != self._pid:  # forked: NVML handles belong to the parent
            try:
                self._open()
            except Exception as e:
                logger.warning("NVML re-initialisation after fork failed: %s", e)
                self._devices = []
                return []
        own = self._publish()
        readings = []
        for dev in self._devices:
            readings.extend(self._device_readings(dev, own))
        self._samples += 1
        return readings

    def _publish(self) -> tuple[str, str] | None:
        """Tell the other workers of the host what runs here; return this worker's (job, dag) tags."""
        if self._share is None or self._activity is None:
            return None
        snap = self._activity()
        if self._share.owns_peers:  # else the sampler published it, for the host and every GPU at once
            self._share.peers.publish_activity(snap)
        return snap.job_tag, snap.dag_tag

    def _device_readings(self, dev: _Device, own: tuple[str, str] | None) -> list[Reading]:
        """This worker's per-worker reading of ``dev``, and the device-wide one if it owns ``dev``."""
        uuid = dev.tags["uuid"]
        mine = self._fields(dev, per_worker=True)
        if self._share is None:
            fields = {**self._fields(dev), **mine}
            return [Reading(GPU, dict(dev.tags), fields)] if fields else []
        if self._samples % 25 == 0 and uuid not in self._shared_reported:
            self._check_shared(uuid)
        if not self._share.owns(uuid):
            return [Reading(GPU, dict(dev.tags), mine)] if mine else []
        device = self._fields(dev)
        tags = self._share.tags(uuid)
        if own is None or tags == own:  # nobody else runs a task on it now: one point
            fields = {**device, **mine}
            return [Reading(GPU, dict(dev.tags), fields)] if fields else []
        readings = [Reading(GPU, {**dev.tags, "job": tags[0], "dag": tags[1]}, device)] if device else []
        return readings + ([Reading(GPU, dict(dev.tags), mine)] if mine else [])

    def _check_shared(self, uuid: str) -> None:
        pids = self._share.sharers(uuid)
        if len(pids) > 1:
            self._shared_reported.add(uuid)
            self._report_to("shared-gpu", f"GPU {uuid} is used by {len(pids)} workers of this host (pids "
                            f"{pids}); its device-wide readings are written once, tagged with all their jobs",
                            uuid=uuid, pids=pids)

    @property
    def handles(self) -> list:
        """NVML handles in visible order; custom metrics get ``fn(worker, handle)``."""
        return [d.handle for d in self._devices]

    @property
    def devices(self) -> list[tuple[int, str, str]]:
        """``(index, uuid, name)`` per visible device."""
        return [(d.index, d.tags["uuid"], d.tags["name"]) for d in self._devices]

    def close(self) -> None:
        """Drop the handles and leave the host's GPU share; NVML itself stays initialised."""
        self._devices = []
        if self._share is not None:
            self._share.close()
            self._share = None


def _nvml_index(nvml, handle) -> int | None:
    """The physical NVML index; None for a MIG instance (NVML numbers only whole GPUs)."""
    try:
        return int(nvml.nvmlDeviceGetIndex(handle))
    except nvml.NVMLError:
        return None


def _worker_fields() -> frozenset:
    return frozenset(f for g in TABLE.values() if g.per_worker for f in g.fields)
