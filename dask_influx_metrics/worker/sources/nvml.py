"""GPU readings from NVML (``import pynvml``, from the ``nvidia-ml-py`` package).

One ``gpu`` reading per visible device, tagged ``index`` (position in
``CUDA_VISIBLE_DEVICES``, 0 = first visible), ``uuid`` and ``name``. Only the
requested fields are read, one NVML call per group of fields:

====================================  =============================================
fields                                NVML call (per read, per device)
====================================  =============================================
utilization_gpu, utilization_memory   ``nvmlDeviceGetUtilizationRates`` (one call)
memory_used, memory_used_percent      ``nvmlDeviceGetMemoryInfo`` v2, else v1; MiB
power_draw                            ``nvmlDeviceGetPowerUsage`` (mW -> W)
temperature_gpu                       ``nvmlDeviceGetTemperatureV``, else legacy
clocks_current_sm                     ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``
memory_total                          read once per device (static), MiB
====================================  =============================================

Errors are per field group and per device. "Not supported" style errors
(NotSupported, NoPermission, FunctionNotFound, ArgumentVersionMismatch, or a
pynvml too old to have the call) first move on to the next variant of the call
(memory v2 -> v1), then switch the group off on that device for good: a MIG
instance, which has no per-instance utilization, simply has no utilization
fields. Any other NVML error omits the group's fields from this sample only
and is logged once per device and group. A reading is never dropped for one
failing field.

NVML is initialised once per process (keyed by ``os.getpid()`` as distributed
does, so a forked worker initialises again) and never shut down per sample.

Limitation: integer entries in ``CUDA_VISIBLE_DEVICES`` are NVML (PCI bus)
indices. CUDA numbers devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``;
on machines that mix GPU models use UUIDs or set that variable.

Example
-------
>>> parse_visible("0, 2")
['0', '2']
>>> parse_visible(None) is None, parse_visible("")
(True, [])
"""

from __future__ import annotations

import logging
import os
import threading

from ...schema import GPU, Reading

logger = logging.getLogger(__name__)

_ENV = object()  # default for ``visible``: read CUDA_VISIBLE_DEVICES
_MIB = float(2**20)

# Field groups: one NVML call serves every field of a group.
_GROUPS = {
    "utilization": ("utilization_gpu", "utilization_memory"),
    "memory": ("memory_used", "memory_used_percent"),
    "power": ("power_draw",),
    "temperature": ("temperature_gpu",),
    "clock": ("clocks_current_sm",),
}

_init_lock = threading.Lock()
_initialised: dict[int, tuple[object, int]] = {}  # id(module) -> (module, pid)


def _import_nvml(nvml=None):
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError as e:
        raise ImportError(
            "NVML GPU metrics need the nvidia-ml-py package (it provides `import pynvml`): "
            "pip install nvidia-ml-py. Without a GPU, set influx-metrics.gpu.source to "
            "'simulated' or 'none'."
        ) from e
    return pynvml


def _init_once(nvml) -> None:
    """``nvmlInit()`` once per process and module (a forked child initialises again)."""
    pid = os.getpid()
    with _init_lock:
        entry = _initialised.get(id(nvml))
        if entry is not None and entry[0] is nvml and entry[1] == pid:
            return
        nvml.nvmlInit()
        _initialised[id(nvml)] = (nvml, pid)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_visible(visible: str | None) -> list[str] | None:
    """Split ``CUDA_VISIBLE_DEVICES``: ``None`` = all devices, ``[]`` = none.

    As in CUDA, a negative index ends the list, so ``-1`` hides every GPU.

    >>> parse_visible("1,-1,0"), parse_visible("-1")
    (['1'], [])
    """
    if visible is None:
        return None
    entries = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            continue
        if entry.startswith("-") and entry[1:].isdigit():
            break
        entries.append(entry)
    return entries


def _mig_children(nvml, handle) -> list:
    """MIG device handles of a physical GPU (none when MIG is off or unsupported)."""
    try:
        if nvml.nvmlDeviceGetMigMode(handle)[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except nvml.NVMLError:
        return []
    children = []
    for i in range(count):
        try:
            children.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
        except nvml.NVMLError:  # NotFound: no MIG device in that slot
            continue
    return children


def _resolve(nvml, entries: list[str] | None) -> list:
    """Handles of the visible devices, in ``CUDA_VISIBLE_DEVICES`` order."""
    count = nvml.nvmlDeviceGetCount()
    if entries is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    physical = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    by_uuid = None  # [(uuid, handle)], built on the first UUID entry
    chosen: list = []
    for entry in entries:
        if entry.isdigit():
            if int(entry) >= count:
                raise ValueError(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r}: no GPU with that index "
                    f"(NVML sees {count} device(s), indices 0..{count - 1})"
                )
            handle = physical[int(entry)]
        elif entry.startswith(("GPU-", "MIG-")):
            if by_uuid is None:
                by_uuid = _uuid_table(nvml, physical)
            exact = [(u, h) for u, h in by_uuid if u == entry]
            matches = exact or [(u, h) for u, h in by_uuid if u.startswith(entry)]
            if len(matches) != 1:
                what = "matches no device" if not matches else (
                    f"is ambiguous ({len(matches)} devices match)"
                )
                known = ", ".join(u for u, _ in by_uuid) or "none"
                raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} {what}; UUIDs: {known}")
            (_, handle), = matches
        else:
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} is neither a device index nor a "
                "UUID starting with 'GPU-' or 'MIG-'"
            )
        if any(h is handle for h in chosen):  # '0' and GPU-0's UUID alike
            raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} names a device twice")
        chosen.append(handle)
    return chosen


def _uuid_table(nvml, physical) -> list:
    table = []
    for handle in physical:
        for h in [handle, *_mig_children(nvml, handle)]:
            try:
                table.append((_text(nvml.nvmlDeviceGetUUID(h)), h))
            except nvml.NVMLError:  # a lost GPU cannot be named, so cannot be chosen
                continue
    return table


class _Device:
    __slots__ = ("index", "handle", "tags", "memory_total", "calls")

    def __init__(self, index, handle, uuid, name, calls):
        self.index = index
        self.handle = handle
        self.tags = {"index": str(index), "uuid": uuid, "name": name}
        self.memory_total = None  # MiB
        self.calls = calls  # group -> remaining variants of its NVML call


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
        self._nvml = nvml = _import_nvml(nvml)
        self._visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is _ENV else visible
        self._want = frozenset(name for m, name in fields if m == GPU)
        self._groups = [g for g, names in _GROUPS.items() if self._want.intersection(names)]
        self._reported: set[tuple[int, str]] = set()
        self._skip = tuple(
            e for e in (
                nvml.NVMLError_NotSupported,
                nvml.NVMLError_NoPermission,
                nvml.NVMLError_FunctionNotFound,
                getattr(nvml, "NVMLError_ArgumentVersionMismatch", None),  # absent from older pynvml
            ) if e is not None
        ) + (AttributeError, TypeError)  # pynvml without the call or its keyword
        self._devices: list[_Device] = []
        self._open()

    def _variants(self) -> dict[str, list]:
        nvml = self._nvml
        return {
            "utilization": [lambda h: nvml.nvmlDeviceGetUtilizationRates(h)],
            "memory": [
                lambda h: nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2),
                lambda h: nvml.nvmlDeviceGetMemoryInfo(h),
            ],
            "power": [lambda h: nvml.nvmlDeviceGetPowerUsage(h)],
            "temperature": [
                lambda h: nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU),
                lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            ],
            "clock": [lambda h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)],
        }

    def _open(self) -> None:
        nvml = self._nvml
        entries = parse_visible(self._visible)  # ValueError before touching NVML
        self._pid = os.getpid()
        self._devices = []
        if entries == []:  # CUDA_VISIBLE_DEVICES="": nothing to read, NVML not needed
            return
        try:
            _init_once(nvml)
            handles = _resolve(nvml, entries)
        except nvml.NVMLError as e:
            raise RuntimeError(
                f"NVML could not start ({e}); is the NVIDIA driver installed and a GPU "
                "present? Without one, set influx-metrics.gpu.source to 'simulated' or 'none'."
            ) from e
        for index, handle in enumerate(handles):
            uuid = self._static(nvml.nvmlDeviceGetUUID, handle, f"GPU-unknown-{index}")
            name = self._static(nvml.nvmlDeviceGetName, handle, "unknown")
            dev = _Device(index, handle, uuid, name, self._variants())
            mem = self._call(dev, "memory")
            if mem is not None and mem.total:
                dev.memory_total = mem.total / _MIB
            self._devices.append(dev)

    def _static(self, fn, handle, default: str) -> str:
        try:
            return _text(fn(handle)) or default
        except self._nvml.NVMLError as e:
            logger.warning("NVML %s failed (%s); using %r", fn.__name__, e, default)
            return default

    def _call(self, dev: _Device, group: str):
        """The group's NVML result for ``dev``, or ``None`` (never raises)."""
        variants = dev.calls[group]
        while variants:
            try:
                return variants[0](dev.handle)
            except self._skip as e:
                variants.pop(0)
                if not variants:
                    logger.info(
                        "GPU %d (%s): %s not available (%s: %s); omitted from now on",
                        dev.index, dev.tags["uuid"], "/".join(_GROUPS[group]), type(e).__name__, e,
                    )
            except Exception as e:  # any other NVMLError: skip this sample only
                if (dev.index, group) not in self._reported:
                    self._reported.add((dev.index, group))
                    logger.warning(
                        "GPU %d (%s): reading %s failed (%s: %s); omitted from this sample "
                        "(reported once)",
                        dev.index, dev.tags["uuid"], "/".join(_GROUPS[group]), type(e).__name__, e,
                    )
                return None
        return None

    def _values(self, dev: _Device, group: str, raw) -> dict:
        if group == "utilization":
            return {"utilization_gpu": float(raw.gpu), "utilization_memory": float(raw.memory)}
        if group == "memory":
            used = raw.used / _MIB
            if dev.memory_total is None and raw.total:
                dev.memory_total = raw.total / _MIB
            out = {"memory_used": used}
            if raw.total:
                out["memory_used_percent"] = 100.0 * raw.used / raw.total
            return out
        if group == "power":
            return {"power_draw": raw / 1000.0}
        if group == "temperature":
            return {"temperature_gpu": float(raw)}
        return {"clocks_current_sm": float(raw)}

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
        want_total = "memory_total" in self._want
        readings = []
        for dev in self._devices:
            fields: dict = {}
            for group in self._groups:
                raw = self._call(dev, group)
                if raw is not None:
                    try:
                        fields.update(self._values(dev, group, raw))
                    except Exception as e:  # a malformed struct: same policy as an error
                        logger.warning("GPU %d: bad %s result %r (%s)", dev.index, group, raw, e)
            if want_total and dev.memory_total is not None:
                fields["memory_total"] = dev.memory_total
            fields = {k: v for k, v in fields.items() if k in self._want}
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
        nvml = _import_nvml(nvml)
    except ImportError:
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is _ENV else visible
    try:
        entries = parse_visible(visible)
        if entries == []:
            return False
        _init_once(nvml)
        return bool(_resolve(nvml, entries))
    except ValueError as e:
        logger.warning("NVML GPU metrics off: %s", e)
        return False
    except Exception as e:  # NVMLError: no library, no driver, ...
        logger.info("NVML GPU metrics off: %s: %s", type(e).__name__, e)
        return False
