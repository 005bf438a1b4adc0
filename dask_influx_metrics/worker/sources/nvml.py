"""GPU readings from NVML (``import pynvml``, from the ``nvidia-ml-py`` package).

One ``gpu`` reading per visible device, tagged ``index`` (position in
``CUDA_VISIBLE_DEVICES``, 0 = first visible), ``uuid`` and ``name``. Only the
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
from .nvml_devices import as_text, import_nvml, init_once, parse_visible, visible_handles

logger = logging.getLogger(__name__)

_ENV = object()  # default for ``visible``: read CUDA_VISIBLE_DEVICES


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
    ``static``: fields read once per device and kept.
    """

    calls: tuple[Call, ...]
    fields: dict[str, Callable]
    static: frozenset = frozenset()


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

    def __init__(self, index, handle, uuid, name, calls):
        self.index = index
        self.handle = handle
        self.tags = {"index": str(index), "uuid": uuid, "name": name}
        self.static: dict = {}  # static fields read so far (memory_total)
        self.calls = calls  # TABLE key -> remaining variants of its NVML call


class NvmlSource:
    """``gpu`` readings for the devices this process may use.

    ``fields`` holds ``(measurement, field)`` pairs (see ``schema.FIELDS``); only
    the ``gpu`` ones are read. ``visible`` defaults to ``CUDA_VISIBLE_DEVICES``;
    ``nvml`` is the pynvml module (imported when ``None``). A bad
    ``CUDA_VISIBLE_DEVICES`` entry raises ``ValueError`` naming it; NVML that
    cannot start raises ``RuntimeError``.

    >>> src = NvmlSource(frozenset({("gpu", "utilization_gpu")}), visible="")  # no GPU visible
    >>> src.devices, src.read()
    ([], [])

    On a GPU, ``src.read()[0]`` is e.g. ``Reading('gpu', {'index': '0', 'uuid':
    'GPU-9baca7f5-...', 'name': 'NVIDIA A100-SXM4-80GB'}, {'utilization_gpu': 87.0})``.
    """

    def __init__(self, fields: frozenset, visible=_ENV, nvml=None):
        self._nvml = nvml = import_nvml(nvml)
        self._visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is _ENV else visible
        self._want = want = frozenset(name for m, name in fields if m == GPU)
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
        variants = {key: _variants(nvml, g) for key, g, _, _ in self._plan}
        for index, handle in enumerate(handles):
            uuid = self._static(nvml.nvmlDeviceGetUUID, handle, f"GPU-unknown-{index}")
            name = self._static(nvml.nvmlDeviceGetName, handle, "unknown")
            dev = _Device(index, handle, uuid, name, {key: list(v) for key, v in variants.items()})
            self._fields(dev, static_only=True)
            self._devices.append(dev)

    def _static(self, fn, handle, default: str) -> str:
        try:
            return as_text(fn(handle)) or default
        except self._nvml.NVMLError as e:
            logger.warning("NVML %s failed (%s); using %r", fn.__name__, e, default)
            return default

    def _fields(self, dev: _Device, static_only: bool = False) -> dict:
        """The wanted fields of ``dev`` now; static ones read only until they have a value."""
        fields: dict = {}
        for key, group, per_sample, static in self._plan:
            todo = [f for f in static if f not in dev.static] + ([] if static_only else per_sample)
            raw = self._call(dev, key, group) if todo else None
            if raw is None:
                continue
            for name in todo:
                try:
                    value = group.fields[name](raw)
                except Exception as e:  # a result unlike the documented one, or a bug: this sample only
                    self._report(dev, name, e)
                    continue
                if value is not None:
                    (dev.static if name in static else fields)[name] = value
        return {**fields, **dev.static}

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
        readings = []
        for dev in self._devices:
            fields = self._fields(dev)
            if fields:
                readings.append(Reading(GPU, dict(dev.tags), fields))
        return readings

    @property
    def handles(self) -> list:
        """NVML handles in visible order; custom metrics get ``fn(worker, handle)``."""
        return [d.handle for d in self._devices]

    @property
    def devices(self) -> list[tuple[int, str, str]]:
        """``(index, uuid, name)`` per visible device."""
        return [(d.index, d.tags["uuid"], d.tags["name"]) for d in self._devices]

    def close(self) -> None:
        """Drop the handles; NVML itself stays initialised for the process."""
        self._devices = []


def nvml_available(nvml=None, visible=_ENV) -> bool:
    """True when pynvml imports, NVML starts and at least one device is visible.

    Never raises: the ``auto`` GPU source falls back to none when this is False.

    >>> nvml_available(visible="")
    False
    """
    try:
        nvml = import_nvml(nvml)
    except ImportError:
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is _ENV else visible
    try:
        entries = parse_visible(visible)
        if entries == []:
            return False
        init_once(nvml)
        return bool(visible_handles(nvml, entries))
    except ValueError as e:
        logger.warning("NVML GPU metrics off: %s", e)
        return False
    except Exception as e:  # NVMLError: no library, no driver, ...
        logger.info("NVML GPU metrics off: %s: %s", type(e).__name__, e)
        return False
