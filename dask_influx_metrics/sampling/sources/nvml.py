"""GPU readings from NVML (``import pynvml``, from the ``nvidia-ml-py`` package).

:class:`NvmlDevices` opens the host's GPUs once (in the agent, or in a worker
sampling in-process), resolves each worker's ``CUDA_VISIBLE_DEVICES`` to UUIDs,
and reads a device's fields once per sample however many workers use it:
device-wide fields, and per-worker ones (``per_worker`` entries: the memory each
worker's process tree holds, :mod:`.gpuprocs`) from the same NVML result. Who
gets which reading is the agent's business (:mod:`..collect`). Only the
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

import functools
import inspect
import logging
from typing import Callable, NamedTuple

from ...names import GpmState
from ...notices import Once
from ...schema import GPU
from . import gpm, procutil, slowfields
from .gpuprocs import Ancestry, host_pid_problem, tree_memory_mib
from .nvml_devices import as_text, choose, import_nvml, init_once, parse_visible, visible_handles
from .nvmlcalls import Call, Group

logger = logging.getLogger(__name__)


MIB = 2.0**20  # bytes -> MiB (inline in the converters: each runs per GPU at every sample)


TABLE: dict[str, Group] = {
    "utilization": Group(
        (Call("nvmlDeviceGetUtilizationRates"),),
        {"utilization_gpu": lambda u: float(u.gpu), "utilization_memory": lambda u: float(u.memory)},
    ),
    "memory": Group(  # v2 does not count reserved memory as used; bytes -> MiB
        (Call("nvmlDeviceGetMemoryInfo", keywords=(("version", "nvmlMemory_v2"),)), Call("nvmlDeviceGetMemoryInfo")),
        {
            "memory_used": lambda m: m.used / MIB,
            "memory_used_percent": lambda m: 100.0 * m.used / m.total if m.total else None,
            "memory_total": lambda m: m.total / MIB if m.total else None,
        },
        static=frozenset({"memory_total"}),
    ),
    "power": Group((Call("nvmlDeviceGetPowerUsage"),), {"power_draw": lambda mw: mw / 1000.0}),  # mW -> W
    "temperature": Group(
        (
            Call("nvmlDeviceGetTemperatureV", ("NVML_TEMPERATURE_GPU",)),
            Call("nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",)),
        ),
        {"temperature_gpu": float},  # C
    ),
    "clock": Group((Call("nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",)),), {"clocks_current_sm": float}),  # MHz
    "clock_memory": Group(  # ~1 us on an H100
        (Call("nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",)),), {"clocks_current_memory": float}
    ),  # MHz
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
        if args:
            bound.append(lambda handle, fn=fn, args=args, kwargs=kwargs: fn(handle, *args, **kwargs))
        else:  # fn(handle) as it is, or with its keywords bound: one Python frame less per call
            bound.append(functools.partial(fn, **kwargs) if kwargs else fn)
    if not bound:
        logger.info(
            "this pynvml has none of %s: %s not read", [c.function for c in group.calls], "/".join(group.fields)
        )
    return bound


class Pace(NamedTuple):
    """How often the per-device readers run, in seconds: the polling interval (each sample), GPM's
    window (``gpu.gpm-window``) and a shared GPU's per-process utilization (``gpu.process-interval``)."""

    interval_s: float = 0.2
    gpm_window_s: float = gpm.MIN_WINDOW_S
    process_s: float = procutil.READ_INTERVAL_S

    @classmethod
    def of(cls, settings) -> "Pace":
        return cls(settings.polling_interval / 1000, settings.gpm_window / 1000, settings.process_interval / 1000)


class _Device:
    __slots__ = (
        "handle",
        "uuid",
        "name",
        "nvml_index",
        "static",
        "calls",
        "results",
        "gpm_reader",
        "slow",
        "missing",
        "plans",
        "procs",
        "gpm",
    )

    def __init__(self, handle, uuid, name, calls, nvml_index=None):
        self.handle, self.uuid, self.name, self.nvml_index = handle, uuid, name, nvml_index
        self.static: dict = {}  # static fields read so far (memory_total)
        self.missing: list = []  # (TABLE key, group, static fields) not read yet
        self.plans: tuple = ([], [])  # what each sample reads here: device-wide, per worker (NvmlDevices._fields)
        self.calls = calls  # TABLE key -> remaining variants of its NVML call
        self.results: dict = {}  # TABLE key -> this sample's NVML result (one call for every worker)
        self.gpm_reader = None  # GPM (:mod:`.gpm`): read() -> the fields of a window that ended now
        self.slow = None  # the slow fields (:mod:`.slowfields`): read(final) -> those read now
        self.procs = None  # per-process utilization (:mod:`.procutil`), for a device several processes use
        self.gpm: tuple | None = None  # (GpmState, why or None) where GPM fields are wanted

    def tags(self, index: int) -> dict:
        """The device tags of a ``gpu`` point, ``index`` being its position in a worker's list."""
        tags = {"index": str(index), "uuid": self.uuid, "name": self.name}
        if self.nvml_index is not None:
            tags["nvml_index"] = str(self.nvml_index)
        return tags


class NvmlDevices:
    """The GPUs of this host through NVML (``import pynvml``), initialised once per process.

    ``fields`` holds ``(measurement, field)`` pairs (see ``schema.FIELDS``); only
    the ``gpu`` ones are read. ``devices``: ``gpu.devices`` (see
    :func:`.nvml_devices.choose`). ``nvml``: the pynvml module (imported when
    ``None``). ``report(what, message)`` hears once of per-worker memory that
    cannot be known. ``pace``: how often the readers run (:class:`Pace`). NVML
    that cannot start raises ``RuntimeError``.

    >>> gpus = NvmlDevices(frozenset({("gpu", "utilization_gpu")}))  # doctest: +SKIP
    >>> [uuid] = gpus.resolve(worker); gpus.read(uuid)                # doctest: +SKIP
    {'utilization_gpu': 87.0}
    """

    def __init__(self, fields: frozenset, devices: str = "auto", nvml=None, report=None, pace: Pace = Pace()):
        self._nvml = nvml = import_nvml(nvml)
        self._mode, self._pace = devices, pace
        want = frozenset(name for m, name in fields if m == GPU)
        problem = host_pid_problem() if want & _worker_fields() else None
        if problem and report is not None:
            report("gpu-process-memory", f"per-worker GPU memory left out: {problem}")
        self._want = want - _worker_fields() if problem else want
        # per TABLE entry with a wanted field: (key, group, per-sample fields, static fields)
        self._plan = [
            (
                key,
                g,
                [f for f in g.fields if f in self._want and f not in g.static],
                [f for f in g.static if f in self._want],
            )
            for key, g in TABLE.items()
            if self._want.intersection(g.fields)
        ]
        self._once = Once()
        self._unsupported = tuple(  # NVML's own "this device or driver cannot"
            e
            for e in (
                nvml.NVMLError_NotSupported,
                nvml.NVMLError_NoPermission,
                nvml.NVMLError_FunctionNotFound,
                getattr(nvml, "NVMLError_ArgumentVersionMismatch", None),  # absent from older pynvml
            )
            if e is not None
        )
        self._variants = {key: _variants(nvml, g) for key, g, _, _ in self._plan}
        # what each sample reads, entry by entry: (key, group, ((field, converter), ...))
        self._sample_plan, self._worker_plan = (
            [
                (key, g, tuple((f, g.fields[f]) for f in fields))
                for key, g, fields, _ in self._plan
                if fields and g.per_worker == per_worker
            ]
            for per_worker in (False, True)
        )
        self._devices: dict[str, _Device] = {}  # uuid -> device, opened on first use
        self._ancestry = Ancestry()  # which listed process belongs to which worker
        self._final = False  # this sample is a worker's last (start_sample)
        try:
            init_once(nvml)
        except nvml.NVMLError as e:
            raise RuntimeError(
                f"NVML could not start ({e}); is the NVIDIA driver installed and a GPU "
                "present? Without one, set influx-metrics.gpu.source to 'simulated' or 'none'."
            ) from e

    def resolve(self, worker) -> list[str]:
        """The UUIDs of the GPUs ``worker`` uses (its ``CUDA_VISIBLE_DEVICES``, ``worker.visible``, and
        ``gpu.devices``), in its order. ``ValueError`` for a malformed list; NVML errors as ``RuntimeError``."""
        nvml = self._nvml
        entries = parse_visible(worker.visible)
        if entries == []:  # CUDA_VISIBLE_DEVICES="": nothing to read
            return []
        try:
            handles = choose(visible_handles(nvml, entries), self._mode, visible_set=entries is not None)
        except nvml.NVMLError as e:
            raise RuntimeError(f"NVML could not list the GPUs ({e})") from e
        uuids = []
        for index, handle in enumerate(handles):
            uuid = self._static(nvml.nvmlDeviceGetUUID, handle, f"GPU-unknown-{index}")
            if uuid not in self._devices:
                name = self._static(nvml.nvmlDeviceGetName, handle, "unknown")
                calls = {key: list(v) for key, v in self._variants.items()}
                dev = self._devices[uuid] = _Device(handle, uuid, name, calls, _nvml_index(nvml, handle))
                dev.missing = [(key, g, tuple(static)) for key, g, _, static in self._plan if static]
                dev.plans = (list(self._sample_plan), list(self._worker_plan))
                self._read_static(dev)
                self._readers(dev)
            uuids.append(uuid)
        return uuids

    def tags(self, uuid: str, index: int) -> dict:
        return self._devices[uuid].tags(index)

    def gpm_state(self, uuid: str) -> tuple | None:
        """``(GpmState, why)`` of ``uuid`` (why None when GPM works), or None when no GPM field is wanted."""
        return self._devices[uuid].gpm

    def handle(self, uuid: str):
        """The NVML handle (custom per-device metrics get ``fn(worker, handle)``)."""
        return self._devices[uuid].handle

    def start_sample(self, final: bool = False) -> None:
        """Forget the previous sample's NVML results (each call is made at most once per sample).
        ``final``: the last sample of a worker (or of the session): the counters are read now too."""
        self._final = final
        for dev in self._devices.values():
            dev.results.clear()

    def _readers(self, dev: _Device) -> None:
        """GPM (Hopper+; a MIG instance through its parent), the slow fields (at most once a second)
        and per-process utilization, where wanted."""
        nvml, label = self._nvml, dev.uuid
        if self._want & gpm.FIELDS:
            mig = dev.nvml_index is None and dev.uuid.startswith("MIG-")
            make = gpm.GpmReader.for_mig if mig else gpm.GpmReader
            try:
                reader = make(
                    nvml,
                    dev.handle,
                    interval_s=self._pace.interval_s,
                    window_s=self._pace.gpm_window_s,
                    fields=self._want,
                    label=label,
                )
                dev.gpm_reader, dev.gpm = reader, (reader.state, reader.unsupported)
            except Exception as e:  # this pynvml lacks the MIG calls: no GPM for the instance
                logger.info("%s: GPM metrics left out (%s: %s)", label, type(e).__name__, e)
                dev.gpm = (GpmState.NO_CALLS if isinstance(e, AttributeError) else GpmState.ERROR, f"{e}")
        if self._want & slowfields.SLOW_FIELDS:
            dev.slow = slowfields.SlowFields(nvml, dev.handle, self._want, label=label)
        if self._want & PROCESS_UTILIZATION:
            dev.procs = procutil.ProcessUtilization(nvml, dev.handle, interval_s=self._pace.process_s, label=label)

    def read(self, uuid: str) -> dict:
        """The wanted device-wide fields of ``uuid`` now (static ones included)."""
        dev = self._devices[uuid]
        if dev.missing:
            self._read_static(dev)
        fields = self._fields(dev, dev.plans[0])
        fields.update(dev.static)
        if dev.gpm_reader is not None:
            fields.update(dev.gpm_reader.read())
        if dev.slow is not None:
            fields.update(dev.slow.read(self._final))
        return fields

    def read_worker(self, uuid: str, pid: int, shared: bool = False) -> dict:
        """The wanted per-worker fields of ``uuid`` for the process tree of ``pid`` (a host PID): the
        processes NVML lists that descend from it (:class:`.gpuprocs.Ancestry`). Its share of the GPU's
        time (``worker_utilization_*``, ``worker_gpu_share``) only where the GPU is shared: ``shared``
        (several workers use it) or a process outside the tree holds a context on it (NVML's process list,
        when read for ``worker_memory_used``). NVML's per-process call costs ~2 ms: read at most every
        ``gpu.process-interval`` (1 s); absent from its answer = 0 %."""
        dev = self._devices[uuid]
        if "pids" not in dev.results:  # once per device and sample, whichever of its workers comes first
            processes = self._call(dev, "processes", TABLE["processes"]) if "processes" in self._variants else None
            dev.results["pids"] = [p.pid for p in processes or ()]
        processes = dev.results.get("processes")
        pids = self._ancestry.tree(pid, dev.results["pids"])
        fields = self._fields(dev, dev.plans[1], pids)
        if dev.procs is not None and (shared or (processes and _others(processes, pids))):
            if "procutil" not in dev.results:
                dev.results["procutil"] = dev.procs.read(force=self._final, busy=_busy(dev.results.get("utilization")))
            per_pid = dev.results["procutil"]
            if per_pid is not None:  # a window ended this sample
                pids = self._ancestry.tree(pid, per_pid)
                sm, mem = procutil.worker_utilization(per_pid, {"w": pids})["w"]
                mine = (
                    ("worker_utilization_gpu", sm),
                    ("worker_utilization_memory", mem),
                    ("worker_gpu_share", procutil.share(per_pid, pids)),
                )
                fields.update({k: v for k, v in mine if k in self._want})
        return fields

    def _static(self, fn, handle, default: str) -> str:
        try:
            return as_text(fn(handle)) or default
        except self._nvml.NVMLError as e:
            logger.warning("NVML %s failed (%s); using %r", fn.__name__, e, default)
            return default

    def _fields(self, dev: _Device, plan: list, *pids) -> dict:
        """The fields ``plan`` (the device's copy of :attr:`_sample_plan`, or of :attr:`_worker_plan` given a
        worker's ``pids``) reads from ``dev`` now: one NVML call per entry and sample, one converter per field.
        An entry whose call is off on this device for good leaves the plan."""
        fields: dict = {}
        off = None
        results = dev.results
        for entry in plan:
            key, group, converters = entry
            if key in results:
                raw = results[key]
            else:  # inline, as it runs for every call of every GPU at every sample: the first variant answers
                try:
                    raw = results[key] = dev.calls[key][0](dev.handle)
                except Exception as e:
                    raw = self._call(dev, key, group, failed=e)
            if raw is None:
                if not dev.calls[key]:
                    off = [*(off or ()), entry]
                continue
            for name, convert in converters:
                try:
                    value = convert(raw, *pids)
                except Exception as e:  # a result unlike the documented one, or a bug: this sample only
                    self._report(dev, name, e)
                    continue
                if value is not None:
                    fields[name] = value
        for entry in off or ():
            plan.remove(entry)
        return fields

    def _read_static(self, dev: _Device) -> None:
        """The static fields (``memory_total``) not read yet: when the device opens, and at each sample
        until they have a value or their call is off on this device."""
        missing = []
        for key, group, names in dev.missing:
            raw = self._call(dev, key, group)
            for name in names:
                try:
                    value = None if raw is None else group.fields[name](raw)
                except Exception as e:
                    self._report(dev, name, e)
                    value = None
                if value is not None:
                    dev.static[name] = value
            left = tuple(n for n in names if n not in dev.static)
            if left and dev.calls[key]:
                missing.append((key, group, left))
        dev.missing = missing

    def _call(self, dev: _Device, key: str, group: Group, failed: Exception | None = None):
        """The entry's NVML result for ``dev`` this sample, or ``None`` (never raises). ``failed``: what its first
        variant raised, called already (:meth:`_fields`)."""
        if failed is None and key in dev.results:
            return dev.results[key]
        dev.results[key] = None
        variants = dev.calls[key]
        while variants:
            try:
                if failed is not None:  # handled as if raised here
                    error, failed = failed, None
                    raise error
                dev.results[key] = variants[0](dev.handle)
                break
            except self._unsupported as e:
                variants.pop(0)
                if not variants:
                    logger.info(
                        "%s: %s not available (%s: %s); omitted from now on",
                        dev.uuid,
                        "/".join(group.fields),
                        type(e).__name__,
                        e,
                    )
            except Exception as e:  # any other NVML error, or a bug: this sample only
                self._report(dev, "/".join(group.fields), e)
                break
        return dev.results[key]

    def _report(self, dev: _Device, what: str, error: Exception) -> None:
        if not self._once((dev.uuid, what)):
            return
        logger.warning(
            "%s: reading %s failed (%s: %s); omitted from this sample (reported once)",
            dev.uuid,
            what,
            type(error).__name__,
            error,
            exc_info=None if isinstance(error, self._nvml.NVMLError) else error,  # a bug: where
        )

    def close(self) -> None:
        """Drop the handles (and GPM samples); NVML itself stays initialised."""
        for dev in self._devices.values():
            if dev.gpm_reader is not None:
                dev.gpm_reader.close()
        self._devices = {}


def _busy(utilization) -> bool | None:
    """Whether this sample's utilization result (NVML's, when read) says a kernel ran; None: not read."""
    return None if utilization is None else getattr(utilization, "gpu", 0) > 0


def _others(processes, pids) -> bool:
    """Whether NVML's process list of a device names a process outside ``pids`` (not this worker's)."""
    return any(p.pid not in pids for p in processes or ())


def _nvml_index(nvml, handle) -> int | None:
    """The physical NVML index; None for a MIG instance (NVML numbers only whole GPUs)."""
    try:
        return int(nvml.nvmlDeviceGetIndex(handle))
    except nvml.NVMLError:
        return None


PROCESS_UTILIZATION = frozenset({"worker_utilization_gpu", "worker_utilization_memory", "worker_gpu_share"})


def _worker_fields() -> frozenset:
    """The fields that describe a worker's process tree (host PIDs needed)."""
    return frozenset(f for g in TABLE.values() if g.per_worker for f in g.fields) | PROCESS_UTILIZATION
