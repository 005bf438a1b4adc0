"""What NVML charges, for the benchmarks that pay it (issue 32): the H200's prices per call from the fake's
cost table (``tests/fake_nvml.py``), and what a GPU host cannot avoid burning per sample."""

from __future__ import annotations

import os
import sys

from benchmarks.common import ROOT


def tests_on_path() -> None:
    """``tests/`` importable: the NVML replay (``fake_nvml``, ``nvml_shim``) lives there."""
    tests = os.path.join(ROOT, "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


# The NVML reads a GPU host cannot avoid, per GPU and sample, of those the H200 replay answers (its video
# engines answer NotSupported): utilization, memory, power, temperature, SM and memory clocks, pstate, clock
# event reasons, the compute-process list.
PER_SAMPLE_READS = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetComputeRunningProcesses",
)
GPM_WINDOW_MS, ENERGY_MS, PROCESS_MS = 100, 10_000, 1000


def nvml_prices(load: str = "idle") -> dict:
    """Microseconds of CPU per NVML call on the H200 (``tests/fake_nvml.py``'s cost table)."""
    tests_on_path()
    from fake_nvml import prices

    return prices(load)


def nvml_floor_us(gpus: int, shared_gpus: int, interval_ms: float, load: str = "idle") -> float:
    """What the unavoidable NVML calls burn per sample on the H200: the per-sample reads of each GPU, one GPM
    sample and metrics call (without GRAPHICS_UTIL) per 100 ms window, the energy counter every 10 s, and on
    each shared GPU per-process utilization once a second."""
    p = nvml_prices(load)
    reads = sum(p[f] for f in PER_SAMPLE_READS)
    gpm = (p["nvmlGpmSampleGet"] + p["nvmlGpmMetricsGet"]) * interval_ms / max(interval_ms, GPM_WINDOW_MS)
    energy = p["nvmlDeviceGetTotalEnergyConsumption"] * interval_ms / ENERGY_MS
    per_process = p["nvmlDeviceGetProcessesUtilizationInfo"] * interval_ms / PROCESS_MS
    return gpus * (reads + gpm + energy) + shared_gpus * per_process
