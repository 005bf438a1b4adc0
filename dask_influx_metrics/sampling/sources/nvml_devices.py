"""Which NVML devices a process may use: ``CUDA_VISIBLE_DEVICES`` -> NVML handles.

Entries are device indices or (prefixes of) ``GPU-``/``MIG-`` UUIDs, as CUDA
accepts them; a MIG instance is found among its parent GPU's MIG devices. As in
CUDA, the list ends at the first entry CUDA cannot use (``-1``, an index past the
last GPU, an unknown or ambiguous UUID, text), keeping the devices before it,
and a device named twice counts once. Then ``gpu.devices`` (:func:`choose`)
picks the devices the worker uses and reports.

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

logger = logging.getLogger(__name__)

ENV = object()  # default for ``visible``: read CUDA_VISIBLE_DEVICES
DEVICE_CHOICES = ("auto", "first", "all")

_init_lock = threading.Lock()
_initialised: dict[int, tuple[object, int]] = {}  # id(module) -> (module, pid)


def import_nvml(nvml=None):
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


def init_once(nvml) -> None:
    """``nvmlInit()`` once per process and module (a forked child initialises again)."""
    pid = os.getpid()
    with _init_lock:
        entry = _initialised.get(id(nvml))
        if entry is not None and entry[0] is nvml and entry[1] == pid:
            return
        nvml.nvmlInit()
        _initialised[id(nvml)] = (nvml, pid)


def as_text(value) -> str:
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


def _one(entry: str, physical: list, table: list) -> tuple[object | None, str]:
    """``(handle, "")`` for an entry CUDA can use, else ``(None, why)``."""
    if entry.isdigit():
        if int(entry) < len(physical):
            return physical[int(entry)], ""
        return None, f"no GPU with that index (NVML sees {len(physical)}, indices 0..{len(physical) - 1})"
    if entry.startswith(("GPU-", "MIG-")):
        matches = [h for u, h in table if u == entry] or [h for u, h in table if u.startswith(entry)]
        if len(matches) == 1:
            return matches[0], ""
        return None, "matches no GPU" if not matches else f"is ambiguous ({len(matches)} GPUs match)"
    return None, "is neither a GPU index nor a UUID starting with 'GPU-' or 'MIG-'"


def visible_handles(nvml, entries: list[str] | None) -> list:
    """Handles of the visible devices, in ``CUDA_VISIBLE_DEVICES`` order, as CUDA uses them.

    Like CUDA, the list ends at the first entry that names no usable device,
    keeping the devices before it (logged as a warning naming the entry); a
    device named twice (``0`` and GPU 0's UUID alike) counts once.
    """
    physical = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    if entries is None:
        return physical
    table = _uuid_table(nvml, physical) if any(not e.isdigit() for e in entries) else []
    chosen: list = []
    for entry in entries:
        handle, why = _one(entry, physical, table)
        if handle is None:
            logger.warning(
                "CUDA_VISIBLE_DEVICES entry %r %s; like CUDA, using only the %d device(s) before it",
                entry,
                why,
                len(chosen),
            )
            break
        if not any(h is handle for h in chosen):
            chosen.append(handle)
    return chosen


def choose(devices: list, mode: str, visible_set: bool) -> list:
    """The devices a worker *uses*, of those it sees (``gpu.devices``).

    ``first``: the first visible one. dask-cuda gives each worker every GPU of
    the node rotated so that its own comes first
    (``cuda_visible_devices(3, range(8)) == "3,4,5,6,7,0,1,2"``), and CUDA's current
    device is the first. ``all``: every visible one. ``auto``: ``first`` when
    ``CUDA_VISIBLE_DEVICES`` is set, else ``all``.

    >>> choose(["a", "b", "c"], "auto", visible_set=True), choose(["a", "b"], "auto", visible_set=False)
    (['a'], ['a', 'b'])
    """
    if mode not in DEVICE_CHOICES:
        raise ValueError(f"influx-metrics.gpu.devices must be one of {DEVICE_CHOICES}, got {mode!r}")
    return devices[:1] if mode == "first" or (mode == "auto" and visible_set) else list(devices)


def _uuid_table(nvml, physical) -> list:
    table = []
    for handle in physical:
        for h in [handle, *_mig_children(nvml, handle)]:
            try:
                table.append((as_text(nvml.nvmlDeviceGetUUID(h)), h))
            except nvml.NVMLError:  # a lost GPU cannot be named, so cannot be chosen
                continue
    return table


def nvml_available(nvml=None, visible=ENV) -> bool:
    """True when pynvml imports, NVML starts and at least one device is visible.

    Never raises: the ``auto`` GPU source falls back to none when this is False.

    >>> nvml_available(visible="")
    False
    """
    try:
        nvml = import_nvml(nvml)
    except ImportError:
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is ENV else visible
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
