"""Which NVML devices a process may use: ``CUDA_VISIBLE_DEVICES`` -> NVML handles.

Entries are device indices or (prefixes of) ``GPU-``/``MIG-`` UUIDs, as CUDA
accepts them; a MIG instance is found among its parent GPU's MIG devices.

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

import os
import threading

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


def visible_handles(nvml, entries: list[str] | None) -> list:
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
                table.append((as_text(nvml.nvmlDeviceGetUUID(h)), h))
            except nvml.NVMLError:  # a lost GPU cannot be named, so cannot be chosen
                continue
    return table
