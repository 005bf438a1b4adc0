"""Which GPUs a worker reports: ``CUDA_VISIBLE_DEVICES`` read as CUDA reads it, then ``gpu.devices``.

CUDA reads ``CUDA_VISIBLE_DEVICES`` left to right and **stops at the first
entry it cannot use** (an index past the last GPU, a UUID that matches no GPU
or several, ``-1``, text), keeping the devices before it; a device named twice
counts once. Entries are NVML indices or UUIDs (``GPU-...``, ``MIG-...``, or a
unique prefix). Unset means every GPU.

``gpu.devices`` then says which of those the worker *uses*, and so reports:

* ``first``: the first visible device only. dask-cuda gives each worker every
  GPU of the node, rotated so that its own comes first
  (``cuda_visible_devices(3, range(8)) == "3,4,5,6,7,0,1,2"``), and CUDA's
  current device is the first, so that is the one its tasks use.
* ``all``: every visible device (a worker whose tasks spread over several GPUs).
* ``auto`` (default): ``first`` when ``CUDA_VISIBLE_DEVICES`` is set, else ``all``.

Limitation: integer entries are NVML (PCI bus order) indices. CUDA numbers
devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on machines that
mix GPU models use UUIDs or set that variable.

Example
-------
>>> split_entries("0, 2,,1")
['0', '2', '1']
>>> split_entries(None) is None, split_entries("")
(True, [])
>>> choose(["a", "b", "c"], "auto", visible_set=True), choose(["a", "b"], "auto", visible_set=False)
(['a'], ['a', 'b'])
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "first", "all")


def split_entries(visible: str | None) -> list[str] | None:
    """The comma-separated entries (blank ones dropped); ``None`` = variable unset (all GPUs)."""
    if visible is None:
        return None
    return [e.strip() for e in visible.split(",") if e.strip()]


def choose(devices: list, mode: str, visible_set: bool) -> list:
    """The devices a worker uses, of those it sees (see the module docstring)."""
    if mode not in DEVICE_CHOICES:
        raise ValueError(f"influx-metrics.gpu.devices must be one of {DEVICE_CHOICES}, got {mode!r}")
    if mode == "first" or (mode == "auto" and visible_set):
        return devices[:1]
    return list(devices)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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


def _uuid_table(nvml, physical) -> list:
    table = []
    for handle in physical:
        for h in [handle, *_mig_children(nvml, handle)]:
            try:
                table.append((_text(nvml.nvmlDeviceGetUUID(h)), h))
            except nvml.NVMLError:  # a lost GPU cannot be named, so cannot be chosen
                continue
    return table


def _one(nvml, entry: str, physical: list, table: list | None) -> tuple[object | None, str]:
    """``(handle, "")`` for a usable entry, else ``(None, why)``."""
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


def resolve(nvml, visible: str | None) -> list:
    """NVML handles of the visible devices, in ``CUDA_VISIBLE_DEVICES`` order, as CUDA would use them.

    An entry CUDA cannot use ends the list there; that is logged as a warning
    naming the entry and the devices kept.
    """
    entries = split_entries(visible)
    physical = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    if entries is None:
        return physical
    table = _uuid_table(nvml, physical) if any(not e.isdigit() for e in entries) else []
    chosen: list = []
    for position, entry in enumerate(entries):
        handle, why = _one(nvml, entry, physical, table)
        if handle is None:
            if not (entry.startswith("-") and entry[1:].isdigit()):  # -1 is the usual "no GPU", not a mistake
                logger.warning("CUDA_VISIBLE_DEVICES=%r: entry %r %s; like CUDA, using only the %d device(s) "
                               "before it", visible, entry, why, len(chosen))
            break
        if not any(h is handle for h in chosen):  # '0' and GPU-0's UUID alike: once
            chosen.append(handle)
    return chosen
