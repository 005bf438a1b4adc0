"""GPM's added cost per tick (issue 25): 8 replayed H100s at 50 ms, GPM on vs off.

One sampler thread as the host agent will run it: every metric the NVML table
serves for 8 GPUs (``tests/fake_nvml.py`` replaying ``nvml_h100_shared.json``),
host counters (every 4th tick, the default ``sampler.host-refresh`` at 50 ms),
tasks, lines encoded and dropped. "on" adds a :class:`GpmReader` per GPU made
for a 50 ms interval (a GPM sample every 2nd tick, metrics from the pair).

The replay answers in microseconds of Python, not in driver time, so the cost
per tick is counted explicitly: thread CPU of the tick MINUS the time spent
inside the fake, PLUS the recorded median cost of each NVML call made
(``phases.shared.timing_us``, measured from Python through pynvml on the H100,
so ctypes overhead is included). ``nvmlGpmMetricsGet`` was not timed on the
GPU (it computes from two host-side sample buffers): it counts with the cost
of our Python around it only, and its call count is reported. Target: <= 15 %
more per tick with GPM on.

Run: ``.venv/bin/python -m benchmarks.gpm [--quick]``.
"""

from __future__ import annotations

import copy
import functools
import os
import sys
import time
from collections import Counter

from benchmarks import common
from dask_influx_metrics import config, schema
from dask_influx_metrics.agent.sources.gpm import FIELDS as GPM_FIELDS
from dask_influx_metrics.agent.sources.gpm import GpmReader
from dask_influx_metrics.schema import GPU, Reading
from dask_influx_metrics.worker.sampler import Sampler
from dask_influx_metrics.worker.sources.activity import CachedActivity, TaskRegistry, TaskSource
from dask_influx_metrics.worker.sources.host import HostSource, refresh_seconds
from dask_influx_metrics.worker.sources.nvml import NvmlSource

NAME = "gpm"
GPUS = 8
INTERVAL_MS = 50
TARGET = 15.0  # % more CPU per tick with GPM on
_RECORDED = {  # function -> the timing_us key of its median cost on the H100
    "nvmlDeviceGetUtilizationRates": "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo": "nvmlDeviceGetMemoryInfo(v2)",
    "nvmlDeviceGetPowerUsage": "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTemperatureV": "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetClockInfo": "nvmlDeviceGetClockInfo(SM)",
    "nvmlDeviceGetCurrentClocksEventReasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetPerformanceState": "nvmlDeviceGetPerformanceState",
    "nvmlGpmSampleGet": "nvmlGpmSampleGet",
    "nvmlGpmQueryDeviceSupport": "nvmlGpmQueryDeviceSupport",
}


class _Drop:
    def send(self, lines):
        pass

    def close(self):
        pass


class TimedNvml:
    """The replay with every ``nvml*`` call counted and the time spent inside it measured."""

    def __init__(self, fake):
        self.fake, self.calls, self.inside = fake, Counter(), 0.0
        for name in dir(type(fake)):
            if name.startswith("nvml"):
                setattr(self, name, self._timed(name, getattr(fake, name)))

    def _timed(self, name, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            self.calls[name] += 1
            t0 = time.perf_counter()  # cheap (no syscall); one thread, so wall time inside = CPU inside
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - t0

        return call

    def __getattr__(self, name):  # constants, error classes, ctypes structures
        return getattr(self.fake, name)


class GpmSource:
    """GPM readings of every device of an NvmlSource, tagged as its gpu points (so they merge)."""

    def __init__(self, nvml, nvml_source, window_s):
        self._readers = [
            (d.tags, GpmReader(nvml, d.handle, interval_s=INTERVAL_MS / 1000, window_s=window_s))
            for d in nvml_source._devices
        ]

    def read(self):
        return [Reading(GPU, dict(tags), f) for tags, r in self._readers if (f := r.read())]


def eight_h100s():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from fake_nvml import FakeNvml

    fake = FakeNvml("nvml_h100_shared.json")
    one = fake.devices[0]
    fake.devices[:] = [
        dict(copy.deepcopy(one), uuid=f"GPU-da1f6fd4-9109-0cfa-82af-30bfade809c{i}", index=i) for i in range(GPUS)
    ]
    return fake, fake.data["phases"]["shared"]["timing_us"]


def measure(gpm: float | None, ticks: int) -> dict:
    """Per tick: our Python, recorded NVML and their sum (us); ``gpm``: the GPM window in s, None: off."""
    fake, timing = eight_h100s()
    nvml = TimedNvml(fake)
    fields = schema.fields_for([t for t in schema.TRACKING if t != "gpm"]) | (
        {(GPU, f) for f in GPM_FIELDS} if gpm is not None else set()
    )
    reg = TaskRegistry(nthreads=8, managed_bytes=lambda: 3 << 30)
    for i in range(6):
        reg.started(("task", i), 1, 3)
    activity = CachedActivity(reg)
    gpus = NvmlSource(fields, visible=None, nvml=nvml, activity=activity)
    refresh = refresh_seconds(config.Settings.resolve({}).host_refresh, INTERVAL_MS)
    sources = [gpus, HostSource(fields, refresh=refresh), TaskSource(fields, activity)]
    if gpm is not None:
        sources.insert(1, GpmSource(nvml, gpus, gpm))
    sampler = Sampler(
        sources, _Drop(), lambda: common.TAGS, interval=INTERVAL_MS / 1000, before_sample=activity.refresh
    )
    for _ in range(4):  # warm up: one-time calls (support queries, unsupported fields switched off)
        sampler.sample_and_send()
    nvml.calls.clear()
    nvml.inside = 0.0
    t0 = time.thread_time()
    for _ in range(ticks):
        sampler.sample_and_send()
    cpu = time.thread_time() - t0
    recorded = sum(n * timing[_RECORDED[f]]["median_us"] for f, n in nvml.calls.items() if f in _RECORDED)
    unrecorded = {f: n / ticks for f, n in nvml.calls.items() if f not in _RECORDED}
    python_us = (cpu - nvml.inside) / ticks * 1e6
    return {
        "python_us": python_us,
        "nvml_us": recorded / ticks,
        "total_us": python_us + recorded / ticks,
        "unrecorded_calls_per_tick": unrecorded,
    }


def run(quick: bool) -> list[dict]:
    ticks = 100 if quick else 600
    got = common.alternate(
        {"100": lambda: measure(0.1, ticks), "400": lambda: measure(0.4, ticks), "off": lambda: measure(None, ticks)},
        rounds=3 if quick else 5,
    )
    med = {
        v: {k: common.median([r[k] for r in runs]) for k in ("python_us", "nvml_us", "total_us")}
        for v, runs in got.items()
    }
    off, rows = med["off"], []
    for window in ("100", "400"):
        on = med[window]
        growth = 100.0 * (on["total_us"] / off["total_us"] - 1)
        what = f"{GPUS} replayed H100s @{INTERVAL_MS} ms, GPM window {window} ms"
        rows += [
            common.row(
                NAME,
                f"{what}: agent CPU per tick, GPM on vs off (our Python + recorded NVML cost)",
                round(on["total_us"]),
                "us",
                baseline=round(off["total_us"]),
                met=growth <= TARGET,
                notes=f"+{growth:.1f} % (target <= {TARGET:.0f} %)",
                details={
                    "on": on,
                    "off": off,
                    "unrecorded_calls_per_tick_on": got[window][0]["unrecorded_calls_per_tick"],
                },
            ),
            common.row(
                NAME,
                f"{what}: of which recorded NVML time per tick",
                round(on["nvml_us"], 1),
                "us",
                baseline=round(off["nvml_us"], 1),
            ),
            common.row(
                NAME,
                f"{what}: of which our Python per tick (the fake's own time subtracted)",
                round(on["python_us"]),
                "us",
                baseline=round(off["python_us"]),
            ),
        ]
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
