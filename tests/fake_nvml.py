"""A stand-in for the ``pynvml`` module that replays recorded NVML output.

Only the calls the sources make are implemented, with the real signatures;
constants, exception classes and the GPM ctypes structures come from the
installed pynvml, so the code under test catches the exact classes it would on
a GPU. Every call is counted in ``calls[(function, handle)]``. ``phase`` picks
one of the recording's ``phases`` (the H100 one has idle, shared, after).

GPM replays the recorded ``gpm.metrics`` for any two samples taken in order
(metrics not recorded answer NotSupported, per metric, as NVML does); a device
without a ``gpm`` record is a pre-Hopper GPU (``isSupportedDevice`` 0). Process
utilization replays one recorded answer per call, keeping only samples newer
than the ``timeStamp`` argument, NotFound when none is left, as the driver does;
past the recording, its last answer again, stamped newer (the processes run on).

``cost="idle"`` (or ``"busy"``) is the cost mode: each call spends the thread
CPU that it cost on a real H200 (``data/nvml_h200_costs.json``, measured with
``../shared/gpu/gpmcost.py``; calls it lacks at the recording's median wall time
per call, ``phases.shared.timing_us``), so a benchmark or test that replays pays
what a GPU host pays. ``nvmlGpmMetricsGet`` costs by its metric set (with
``GRAPHICS_UTIL``: ~1.4 ms; without: ~2 us); a NotSupported answer costs
:data:`NOT_SUPPORTED_US`. :attr:`FakeNvml.burned_us` and :attr:`FakeNvml.charged`
(calls per function) add up what was spent, and :attr:`FakeNvml.excess_us` the CPU the
replay's own Python took beyond a call's price (a cheap call: its ~10 us of
Python exceed NVML's 2 us), which a benchmark subtracts; with ``ledger`` (a path) they are
also written there as JSON at most every :data:`LEDGER_S` seconds, for a
benchmark to read from another process.

>>> fake = FakeNvml()
>>> fake.nvmlInit(); fake.nvmlDeviceGetCount()
4
>>> fake.nvmlDeviceGetUtilizationRates(fake.nvmlDeviceGetHandleByIndex(0)).gpu
87
"""

from __future__ import annotations

import copy
import ctypes
import functools
import itertools
import json
import os
import pathlib
import struct
import time
from collections import Counter
from types import SimpleNamespace
from typing import NamedTuple

import pynvml

DATA = pathlib.Path(__file__).parent / "data"
RECORDING = "nvml_a100x2_k80_mig.json"
COSTS = "nvml_h200_costs.json"
NOT_SUPPORTED_US = 100.0  # what NVML's NotSupported answers cost on the H200 (fan speed 113 us, ...)
DEFAULT_US = 2.0  # a call the cost table and the recording both lack: a plain getter
LEDGER_S = 0.5
LEDGER_BYTES = 4096
# function -> its entry in COSTS' cpu_us (thread CPU; idle/busy)
_CPU = {
    "nvmlDeviceGetUtilizationRates": "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo": "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses",
    "nvmlGpmSampleGet": "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet": "nvmlGpmSampleGet",
    "nvmlDeviceGetTotalEnergyConsumption": "nvmlDeviceGetTotalEnergyConsumption",
}
_GPM_CHEAP, _GPM_GRAPHICS = (
    "nvmlGpmMetricsGet_without_GRAPHICS_UTIL_1_to_4_metrics",
    "nvmlGpmMetricsGet_9_or_17_metrics_with_GRAPHICS_UTIL",
)


def prices(load: str = "idle") -> dict[str, float]:
    """Microseconds of CPU per call on the H200 (``load``: ``idle`` or ``busy``): the cost table's
    thread CPU where it has the call, else its wall time, else the recording's median wall time."""
    table = json.loads((DATA / COSTS).read_text())
    recorded = json.loads((DATA / "nvml_h200_shared.json").read_text())["phases"]["shared"]["timing_us"]
    out = {name.split("(")[0]: t["median_us"] for name, t in recorded.items() if "median_us" in t}
    out.update({name: us for name, us in table["wall_us"].items() if "_" not in name})
    out.update({fn: table["cpu_us"][key][load] for fn, key in _CPU.items()})
    out["nvmlGpmMetricsGet"] = table["cpu_us"][_GPM_CHEAP][load]
    out["nvmlGpmMetricsGet+GRAPHICS_UTIL"] = table["cpu_us"][_GPM_GRAPHICS][load]
    return out


def read_ledger(path) -> dict:
    """What a cost-mode fake wrote with ``ledger=path`` (``{}`` until it has): ``burned_us``, ``calls``."""
    for _ in range(3):  # a read that met a write half done is read again
        try:
            with open(path, "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return {}
        except ValueError:
            continue
    return {}


def burn_until(end_ns: int) -> int:
    """Spend this thread's CPU until its clock reads ``end_ns``; returns the clock then (>= ``end_ns``)."""
    now = time.thread_time_ns()
    while now < end_ns:
        now = time.thread_time_ns()
    return now


class Handle(NamedTuple):
    gpu: int
    mig: int | None = None


class FakeNvml:
    def __init__(
        self,
        recording: str = RECORDING,
        as_bytes: bool = False,
        phase: str | None = None,
        cost: str | None = None,
        ledger: str | None = None,
    ):
        self.data = json.loads((DATA / recording).read_text())
        self.devices = self.data["devices"] if phase is None else self.data["phases"][phase]["devices"]
        self.as_bytes = as_bytes  # pynvml < 11.5 returned bytes for names and UUIDs
        self.calls: Counter = Counter()
        self.initialised = False
        self._gpm_ids = itertools.count(1)
        self._gpm_samples: dict[int, tuple | None] = {}  # sample id -> (entity record, order) once taken
        self._gpm_order = itertools.count()
        self._gpm_answers: dict = {}  # (metric ids, recorded metrics' id) -> the results' bytes
        self.burned_us = 0.0  # cost mode: CPU spent as the H200 would
        self.charged: Counter = Counter()  # cost mode: calls per function
        self.excess_us = 0.0  # cost mode: the replay's own Python beyond the price (no GPU host spends it)
        self._ledger, self._ledger_at, self._ledger_fd = ledger, 0.0, None
        if cost is not None:
            self._prices = prices(cost)
            for name in dir(type(self)):
                if name.startswith("nvml"):
                    setattr(self, name, self._charging(name, getattr(self, name)))

    def with_gpus(self, count: int) -> "FakeNvml":
        """``count`` copies of the first device, each with its own UUID and index (a node of one model)."""
        one = self.devices[0]
        self.devices[:] = [dict(copy.deepcopy(one), uuid=f"{one['uuid'][:-2]}{i:02x}", index=i) for i in range(count)]
        return self

    def map_pids(self, pids: dict) -> "FakeNvml":
        """Recorded process ids replaced (``{recorded: pid}``) in the process lists and the per-process
        utilization samples of every device and phase: real processes stand for the recorded ones."""
        records = [*self.devices, *(d for ph in self.data.get("phases", {}).values() for d in ph["devices"])]
        for dev in records:
            for key in ("compute_processes", "process_utilization", "processes_utilization_info"):
                answers = dev.get(key)
                for answer in answers if isinstance(answers, list) else ():
                    for p in answer:
                        p["pid"] = pids.get(p["pid"], p["pid"])
        return self

    def _charging(self, name: str, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            start, price = time.thread_time_ns(), self._prices.get(name, DEFAULT_US)
            try:
                result = fn(*args, **kwargs)
                if name == "nvmlGpmMetricsGet" and _asks_graphics(args[0]):
                    price = self._prices["nvmlGpmMetricsGet+GRAPHICS_UTIL"]
                return result
            except pynvml.NVMLError_NotSupported:
                price = NOT_SUPPORTED_US
                raise
            finally:  # the replay's own Python counts towards the price: a call costs what NVML's did
                # what the call took beyond its price (the replay's Python, the last clock read's overshoot)
                self.excess_us += (burn_until(start + int(price * 1000)) - start) / 1000 - price
                self.burned_us += price
                self.charged[name] += 1
                if self._ledger and time.monotonic() - self._ledger_at >= LEDGER_S:
                    self.write_ledger()

        return call

    def write_ledger(self) -> None:
        """``{"burned_us", "calls"}`` over the ledger file's start, space-padded to its fixed size (one
        ``pwrite`` on a descriptor kept open: a file created and renamed each time cost the process that
        is measured ~1 ms); :func:`read_ledger` reads it."""
        self._ledger_at = time.monotonic()
        if self._ledger_fd is None:
            self._ledger_fd = os.open(self._ledger, os.O_RDWR | os.O_CREAT, 0o600)
        data = json.dumps({"burned_us": self.burned_us, "excess_us": self.excess_us, "calls": dict(self.charged)})
        data = data.encode()
        os.pwrite(self._ledger_fd, data.ljust(max(LEDGER_BYTES, len(data))), 0)

    def __getattr__(self, name):
        # Constants, error classes and GPM structures only: a function the fake lacks must fail.
        if name.startswith(("NVML_", "NVMLError", "nvmlMemory_v", "nvmlTemperature_v", "c_nvmlGpm")):
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
        return copy.copy(value) if isinstance(value, (dict, list)) else value  # fresh, as a call's answer is

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
        key = {pynvml.NVML_CLOCK_SM: "clock_sm", pynvml.NVML_CLOCK_MEM: "clock_mem"}[type]
        return self._value("nvmlDeviceGetClockInfo", handle, key)

    def nvmlDeviceGetPerformanceState(self, handle):
        return self._value("nvmlDeviceGetPerformanceState", handle, "pstate")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._value("nvmlDeviceGetTotalEnergyConsumption", handle, "energy_mj")

    def nvmlDeviceGetEncoderUtilization(self, handle):
        return self._value("nvmlDeviceGetEncoderUtilization", handle, "encoder_utilization")  # [util, period_us]

    def nvmlDeviceGetDecoderUtilization(self, handle):
        return self._value("nvmlDeviceGetDecoderUtilization", handle, "decoder_utilization")

    def nvmlDeviceGetJpgUtilization(self, handle):
        return self._value("nvmlDeviceGetJpgUtilization", handle, "jpg_utilization")

    def nvmlDeviceGetOfaUtilization(self, handle):
        return self._value("nvmlDeviceGetOfaUtilization", handle, "ofa_utilization")

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType):
        counts = self._value("nvmlDeviceGetTotalEccErrors", handle, "ecc_errors")  # {"volatile": [corr, uncorr], ...}
        return counts[("volatile", "aggregate")[counterType]][errorType]

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

    # -- MIG instances ---------------------------------------------------------
    def nvmlDeviceGetGpuInstanceId(self, device):
        self._check_init()
        if device.mig is None:
            raise pynvml.NVMLError_InvalidArgument()
        return self._record(device).get("gpu_instance_id", device.mig)  # the position unless recorded

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice):
        self._check_init()
        if migDevice.mig is None:
            raise pynvml.NVMLError_InvalidArgument()
        return Handle(migDevice.gpu)

    # -- per-process utilization -------------------------------------------------
    def nvmlDeviceGetProcessUtilization(self, handle, timeStamp):
        return self._process_samples("nvmlDeviceGetProcessUtilization", handle, "process_utilization", timeStamp)

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle, timeStamp):
        return self._process_samples(
            "nvmlDeviceGetProcessesUtilizationInfo", handle, "processes_utilization_info", timeStamp
        )

    def _process_samples(self, function, handle, key, since):
        answers = self._record(handle).get(key)
        recorded = self._value(function, handle, key)
        fresh = [s for s in recorded if s["timeStamp"] > since]
        if not fresh and isinstance(answers, list) and len(answers) == 1:  # replayed past the recording:
            fresh = [dict(s, timeStamp=since + 1) for s in recorded]  # its processes run on as in its last answer
        if not fresh:  # the driver's answer when no process ran a kernel since ``since``
            raise pynvml.NVMLError_NotFound()
        return [SimpleNamespace(**s) for s in fresh]

    # -- GPM ---------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device):
        self._check_init()
        self.calls["nvmlGpmQueryDeviceSupport", device] += 1
        if device.mig is not None:
            raise pynvml.NVMLError_InvalidArgument()
        support = (
            self._record(device).get("gpm", {}).get("query_device_support", {"version": 1, "isSupportedDevice": 0})
        )
        return SimpleNamespace(**support)

    def nvmlGpmSampleAlloc(self):
        self._check_init()
        sample_id = next(self._gpm_ids)
        self._gpm_samples[sample_id] = None
        return ctypes.cast(ctypes.c_void_p(sample_id), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, gpmSample):
        self._gpm_samples.pop(self._sample_id(gpmSample))

    def nvmlGpmSampleGet(self, device, gpmSample):
        self.calls["nvmlGpmSampleGet", device] += 1
        if device.mig is not None:  # a MIG instance is sampled through its parent: nvmlGpmMigSampleGet
            raise pynvml.NVMLError_InvalidArgument()
        return self._gpm_take(self._record(device), gpmSample)

    def nvmlGpmMigSampleGet(self, device, gpuInstanceId, gpmSample):
        self.calls["nvmlGpmMigSampleGet", device] += 1
        if device.mig is not None:
            raise pynvml.NVMLError_InvalidArgument()
        instances = [
            m for i, m in enumerate(self._record(device).get("mig", [])) if m.get("gpu_instance_id", i) == gpuInstanceId
        ]
        if not instances:
            raise pynvml.NVMLError_NotFound()
        if not self._record(device).get("gpm", {}).get("query_device_support", {}).get("isSupportedDevice"):
            raise pynvml.NVMLError_NotSupported()
        return self._gpm_take(instances[0], gpmSample)

    def _gpm_take(self, record, sample):
        self._check_init()
        if "gpm" not in record:
            raise pynvml.NVMLError_NotSupported()
        self._gpm_samples[self._sample_id(sample)] = (id(record), next(self._gpm_order), record["gpm"]["metrics"])
        return sample

    def nvmlGpmMetricsGet(self, metricsGet):
        self.calls["nvmlGpmMetricsGet", None] += 1
        first = self._gpm_samples.get(self._sample_id(metricsGet.sample1))
        second = self._gpm_samples.get(self._sample_id(metricsGet.sample2))
        if (
            metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION
            or first is None
            or second is None
            or first[0] != second[0]
            or first[1] >= second[1]
        ):  # two samples of one entity, in order
            raise pynvml.NVMLError_InvalidArgument()
        n, start = metricsGet.numMetrics, type(metricsGet).metrics.offset
        ids = _gpm_ids(n).unpack_from(memoryview(metricsGet).cast("B"), start)
        answer = self._gpm_answers.get((ids, id(second[2])))
        if answer is None:  # the request's results, built once (a replay is not to cost more than NVML)
            names = {getattr(pynvml, "NVML_GPM_METRIC_" + name): name for name in second[2]}
            results = (pynvml.c_nvmlGpmMetric_t * n)()
            for metric, metric_id in zip(results, ids):
                name = names.get(metric_id)
                metric.metricId = metric_id
                metric.nvmlReturn = pynvml.NVML_SUCCESS if name else pynvml.NVML_ERROR_NOT_SUPPORTED
                metric.value = second[2][name]["value"] if name else 0.0
            answer = self._gpm_answers[ids, id(second[2])] = bytes(results)
        ctypes.memmove(ctypes.addressof(metricsGet) + start, answer, len(answer))
        return metricsGet

    def _sample_id(self, sample) -> int:
        sample_id = ctypes.cast(sample, ctypes.c_void_p).value
        if sample_id not in self._gpm_samples:
            raise pynvml.NVMLError_InvalidArgument()
        return sample_id


def _asks_graphics(request) -> bool:
    wanted = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    return any(request.metrics[i].metricId == wanted for i in range(request.numMetrics))


@functools.lru_cache
def _gpm_ids(n: int) -> struct.Struct:
    """The metric ids of a request's first ``n`` results, in one unpack."""
    step = ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
    return struct.Struct("=" + f"I{step - 4}x" * n)
