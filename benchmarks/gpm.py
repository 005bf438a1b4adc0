"""GPM's added cost per agent tick (issue 25): 8 replayed H100s, 8 workers, 50 ms, GPM on vs off.

The host agent's sampling path as it runs (:class:`HostCollector` over 8
:class:`WorkerView`\\ s, one GPU each as dask-cuda pins them, reading their
process by pid; the host counters every 4th tick, the default
``sampler.host-refresh`` at 50 ms; lines encoded and sent over UDP to a bound
loopback socket): every metric, with and without the GPM fields.
``tests/fake_nvml.py`` replays ``nvml_h100_shared.json`` for the 8 GPUs.

The replay answers in microseconds of Python, not in driver time, so the cost
per tick is counted explicitly: thread CPU of the tick MINUS the time spent
inside the fake, PLUS the recorded median cost of each NVML call made
(``phases.shared.timing_us``, measured from Python through pynvml on the H100,
so ctypes overhead is included). ``nvmlGpmMetricsGet`` was not timed on the
GPU (it computes from two host-side sample buffers): it counts with the cost of
our Python around it only, and its call count is reported. Each GPM window
(``gpu.gpm-window``) is a variant: a GPM sample every k-th tick, k = window /
interval. Target: <= 15 % more per tick with GPM on, at the default window.

Run: ``.venv/bin/python -m benchmarks.gpm [--quick]``.
"""

from __future__ import annotations

import copy
import functools
import os
import socket
import sys
import time
from collections import Counter

from benchmarks import common
from dask_influx_metrics import config, schema
from dask_influx_metrics.agent.collect import HostCollector
from dask_influx_metrics.agent.sources.gpm import FIELDS as GPM_FIELDS
from dask_influx_metrics.agent.sources.host import HostSource, refresh_seconds
from dask_influx_metrics.agent.sources.nvml import NvmlDevices, Pace
from dask_influx_metrics.agent.workers import WorkerView
from dask_influx_metrics.sampler import Sampler
from dask_influx_metrics.sinks.udp import UdpSink
from dask_influx_metrics.snapshot import Activity

NAME = "gpm"
GPUS = 8
INTERVAL_MS = 50
TARGET = 15.0  # % more CPU per tick with GPM on
WINDOWS_MS = (config.Settings.resolve({}).gpm_window, 200, 400, 1000)  # the default first
_RECORDED = {  # function -> the timing_us key of its median cost on the H100
    "nvmlDeviceGetUtilizationRates": "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo": "nvmlDeviceGetMemoryInfo(v2)",
    "nvmlDeviceGetPowerUsage": "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTemperatureV": "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetClockInfo": "nvmlDeviceGetClockInfo(SM)",
    "nvmlDeviceGetCurrentClocksEventReasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetPerformanceState": "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetTotalEnergyConsumption": "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetFanSpeed": "nvmlDeviceGetFanSpeed",
    "nvmlGpmSampleGet": "nvmlGpmSampleGet",
    "nvmlGpmQueryDeviceSupport": "nvmlGpmQueryDeviceSupport",
}


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


def eight_h100s():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from fake_nvml import FakeNvml

    fake = FakeNvml("nvml_h100_shared.json")
    one = fake.devices[0]
    fake.devices[:] = [
        dict(copy.deepcopy(one), uuid=f"GPU-da1f6fd4-9109-0cfa-82af-30bfade809c{i}", index=i) for i in range(GPUS)
    ]
    return fake, fake.data["phases"]["shared"]["timing_us"]


def _busy():
    """A worker running two tasks of job 1 (``refresh()`` per sample, as the agent's snapshot readers)."""
    snap = Activity(((("task", 0), 1, 3), (("task", 1), 1, 3)), 8, 3 << 30, 1)
    activity = lambda: snap  # noqa: E731
    activity.refresh = lambda: None
    return activity


def measure(window_ms: float | None, ticks: int) -> dict:
    """Per tick: our Python, recorded NVML and their sum (us); ``window_ms`` None: GPM off."""
    fake, timing = eight_h100s()
    nvml = TimedNvml(fake)
    fields = schema.fields_for([t for t in schema.TRACKING if t != "gpm"])
    if window_ms is not None:
        fields |= {(schema.GPU, f) for f in GPM_FIELDS}
    pace = Pace(INTERVAL_MS / 1000, (window_ms or 100) / 1000)
    gpus = NvmlDevices(fields, nvml=nvml, pace=pace)
    workers = []
    for i in range(GPUS):
        address = f"tcp://127.0.0.1:{40000 + i}"
        info = {"address": address, "pid": os.getpid(), "tags": {"host": "h", "worker": address}, "visible": str(i)}
        view = WorkerView(f"w{i}", info, _busy(), fields, offset=lambda: 0.0)
        view.uuids = gpus.resolve(view)
        workers.append(view)
    refresh = refresh_seconds(config.Settings.resolve({}).host_refresh, INTERVAL_MS)
    host = HostSource(frozenset(f for f in fields if f[0] == schema.HOST), refresh=refresh)
    collector = HostCollector(fields, gpus, host)
    drain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    drain.bind(("127.0.0.1", 0))
    sink = UdpSink(drain.getsockname())
    sampler = Sampler(lambda now_ns: collector.collect(workers, now_ns), sink, interval=INTERVAL_MS / 1000)
    try:
        for _ in range(8):  # warm up: one-time calls (support queries, unsupported fields switched off)
            sampler.sample_and_send()
            _empty(drain)
        nvml.calls.clear()
        nvml.inside = 0.0
        cpu = 0.0
        for _ in range(ticks):
            t0 = time.thread_time()
            sampler.sample_and_send()
            cpu += time.thread_time() - t0
            _empty(drain)  # not counted: Telegraf's work
    finally:
        sink.close()
        drain.close()
        gpus.close()
    recorded = sum(n * timing[_RECORDED[f]]["median_us"] for f, n in nvml.calls.items() if f in _RECORDED)
    unrecorded = {f: n / ticks for f, n in nvml.calls.items() if f not in _RECORDED}
    python_us = (cpu - nvml.inside) / ticks * 1e6
    return {
        "python_us": python_us,
        "nvml_us": recorded / ticks,
        "total_us": python_us + recorded / ticks,
        "unrecorded_calls_per_tick": unrecorded,
    }


def _empty(sock) -> None:
    sock.setblocking(False)
    try:
        while True:
            sock.recv(65536)
    except BlockingIOError:
        pass


def run(quick: bool) -> list[dict]:
    ticks = 100 if quick else 400
    variants = {str(w): functools.partial(measure, w, ticks) for w in WINDOWS_MS}
    got = common.alternate({"off": functools.partial(measure, None, ticks), **variants}, rounds=3 if quick else 7)
    med = {
        v: {k: common.median([r[k] for r in runs]) for k in ("python_us", "nvml_us", "total_us")}
        for v, runs in got.items()
    }
    off, rows = med["off"], []
    for window in variants:
        on = med[window]
        growth = 100.0 * (on["total_us"] / off["total_us"] - 1)
        default = window == str(WINDOWS_MS[0])
        what = f"{GPUS} replayed H100s, {GPUS} workers @{INTERVAL_MS} ms, GPM window {window} ms" + (
            " (default)" if default else ""
        )
        rows += [
            common.row(
                NAME,
                f"{what}: agent CPU per tick, GPM on vs off (our Python + recorded NVML cost)",
                round(on["total_us"]),
                "us",
                baseline=round(off["total_us"]),
                target=f"<= +{TARGET:.0f} %" if default else None,
                met=growth <= TARGET if default else None,
                notes=f"+{growth:.1f} %; NVML {on['nvml_us']:.0f} vs {off['nvml_us']:.0f} us, "
                f"Python {on['python_us']:.0f} vs {off['python_us']:.0f} us",
                details={
                    "on": on,
                    "off": off,
                    "unrecorded_calls_per_tick_on": got[window][0]["unrecorded_calls_per_tick"],
                },
            ),
        ]
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
