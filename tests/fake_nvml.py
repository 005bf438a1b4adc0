"""A stand-in for the ``pynvml`` module that replays recorded NVML output.

Only the calls ``agent/sources/nvml.py`` makes are implemented, with the real
signatures; constants and exception classes come from the installed pynvml, so
the code under test catches the exact classes it would on a GPU. Every call is
counted in ``calls[(function, handle)]``.

>>> fake = FakeNvml()
>>> fake.nvmlInit(); fake.nvmlDeviceGetCount()
4
>>> fake.nvmlDeviceGetUtilizationRates(fake.nvmlDeviceGetHandleByIndex(0)).gpu
87
"""

from __future__ import annotations

import copy
import json
import pathlib
from collections import Counter
from types import SimpleNamespace
from typing import NamedTuple

import pynvml

DATA = pathlib.Path(__file__).parent / "data"
RECORDING = "nvml_a100x2_k80_mig.json"


class Handle(NamedTuple):
    gpu: int
    mig: int | None = None


class FakeNvml:
    def __init__(self, recording: str = RECORDING, as_bytes: bool = False):
        self.data = json.loads((DATA / recording).read_text())
        self.devices = self.data["devices"]
        self.as_bytes = as_bytes  # pynvml < 11.5 returned bytes for names and UUIDs
        self.calls: Counter = Counter()
        self.initialised = False

    def __getattr__(self, name):
        # Constants and error classes only: a function the fake lacks must fail.
        if name.startswith(("NVML_", "NVMLError", "nvmlMemory_v", "nvmlTemperature_v")):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml has no {name!r}")

    def calls_to(self, function: str) -> int:
        return sum(n for (f, _), n in self.calls.items() if f == function)

    # -- replay ------------------------------------------------------------
    def _record(self, handle: Handle) -> dict:
        dev = self.devices[handle.gpu]
        return dev if handle.mig is None else dev["mig"][handle.mig]

    def _value(self, function: str, handle, key: str):
        self._check_init()
        self.calls[function, handle] += 1
        value = self._record(handle).get(key, {"error": "NotSupported"})
        if isinstance(value, list) and key != "mig_mode":
            value = value.pop(0) if len(value) > 1 else value[0]
        if isinstance(value, dict) and "error" in value:
            raise getattr(pynvml, "NVMLError_" + value["error"])()
        return copy.deepcopy(value)

    def _check_init(self):
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()

    def _str(self, text: str):
        return text.encode() if self.as_bytes else text

    # -- the pynvml API, same signatures -------------------------------------
    def nvmlInit(self):
        self.calls["nvmlInit", None] += 1
        if "init_error" in self.data:
            raise getattr(pynvml, "NVMLError_" + self.data["init_error"])()
        self.initialised = True

    def nvmlDeviceGetCount(self):
        self._check_init()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._check_init()
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError_InvalidArgument()
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle):
        return self._str(self._value("nvmlDeviceGetUUID", handle, "uuid"))

    def nvmlDeviceGetName(self, handle):
        return self._str(self._value("nvmlDeviceGetName", handle, "name"))

    def nvmlDeviceGetMigMode(self, device):
        return self._value("nvmlDeviceGetMigMode", device, "mig_mode")

    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        return self._value("nvmlDeviceGetMaxMigDeviceCount", device, "max_mig")

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        self._check_init()
        if index >= len(self._record(device).get("mig", [])):
            raise pynvml.NVMLError_NotFound()
        return Handle(device.gpu, index)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(**self._value("nvmlDeviceGetUtilizationRates", handle, "utilization"))

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if not version:
            return SimpleNamespace(**self._value("nvmlDeviceGetMemoryInfo", handle, "memory_v1"))
        mem = self._value("nvmlDeviceGetMemoryInfo_v2", handle, "memory_v2")
        if version != pynvml.nvmlMemory_v2:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        return SimpleNamespace(version=version, **mem)

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._value("nvmlDeviceGetPowerUsage", handle, "power_mw")

    def nvmlDeviceGetTemperatureV(self, handle, sensor, version=pynvml.nvmlTemperature_v1):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._value("nvmlDeviceGetTemperatureV", handle, "temperature_v")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._value("nvmlDeviceGetTemperature", handle, "temperature")

    def nvmlDeviceGetClockInfo(self, handle, type):
        assert type == pynvml.NVML_CLOCK_SM
        return self._value("nvmlDeviceGetClockInfo", handle, "clock_sm")

    def nvmlDeviceGetFanSpeed(self, handle):
        return self._value("nvmlDeviceGetFanSpeed", handle, "fan")

    def nvmlDeviceGetIndex(self, handle):
        self._check_init()
        if handle.mig is not None:  # NVML has no index for a MIG device handle
            raise pynvml.NVMLError_InvalidArgument()
        return self._record(handle).get("index", handle.gpu)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        procs = self._value("nvmlDeviceGetComputeRunningProcesses", handle, "compute_processes")
        return [SimpleNamespace(**p) for p in procs]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._value("nvmlDeviceGetCurrentClocksEventReasons", handle, "clocks_event_reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._value("nvmlDeviceGetCurrentClocksThrottleReasons", handle, "clocks_throttle_reasons")
