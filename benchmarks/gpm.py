"""What GPM costs, paying what NVML charges on a real H200: per GPU and window, and per agent tick.

The host agent's sampling path as it runs (:class:`HostCollector` over 8
:class:`WorkerView`\\ s, one GPU each as dask-cuda pins them, reading their
process by pid; the host counters every 4th tick, the default
``sampler.host-refresh`` at 50 ms; lines encoded and sent over UDP to a bound
loopback socket), paced every 50 ms as the agent is (caches as cold as its), every metric, 8 GPUs replayed from the H200 recording in the
fake's cost mode (``tests/fake_nvml.py``: each NVML call spends the thread CPU it
cost on the busy H200; ``nvmlGpmSampleGet`` 57.8 us, ``nvmlGpmMetricsGet`` 1.8 us
without ``GRAPHICS_UTIL``). The replay's own Python beyond each call's price is left out.

Rows: GPM per GPU and window (``GpmReader.read`` on the calls that take a GPM
sample: ``nvmlGpmSampleGet`` + ``nvmlGpmMetricsGet`` + our Python; target
<= 80 us, issue 32); and the agent's CPU per tick with GPM off and on at each
``gpu.gpm-window`` (informational).

Run: ``.venv/bin/python -m benchmarks.gpm [--quick]``.
"""

from __future__ import annotations

import functools
import os
import socket
import time

from benchmarks import common, nvmlprices
from dask_influx_metrics import config, schema
from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.sampling.collect import HostCollector
from dask_influx_metrics.sampling.sampler import Sampler
from dask_influx_metrics.sampling.sources.gpm import FIELDS as GPM_FIELDS
from dask_influx_metrics.sampling.sources.host import HostSource, refresh_seconds
from dask_influx_metrics.sampling.sources.nvml import NvmlDevices, Pace
from dask_influx_metrics.sampling.view import WorkerView
from dask_influx_metrics.sinks.udp import UdpSink

NAME = "gpm"
GPUS = 8
INTERVAL_MS = 50
TARGET_US = 80.0  # SampleGet + MetricsGet + our Python per GPU per window
WINDOWS_MS = (config.Settings.resolve({}).gpm_window, 200, 400, 1000)  # the default first


def eight_h200s():
    """The H200 recording (its busy phase), cost mode, as a node of 8."""
    nvmlprices.tests_on_path()
    from fake_nvml import FakeNvml

    return FakeNvml("nvml_h200_shared.json", cost="busy").with_gpus(GPUS)


def _busy():
    """A worker running two tasks of job 1 (``refresh()`` per sample, as the agent's snapshot readers)."""
    snap = Snapshot(((("task", 0), 1, 3), (("task", 1), 1, 3)), 8, 3 << 30, 1)
    snapshot = lambda: snap  # noqa: E731
    snapshot.refresh = lambda: None
    return snapshot


def measure(window_ms: float | None, ticks: int) -> dict:
    """Per tick: CPU (us), of which NVML's price; per GPM window: CPU of one GPU's read (us).
    ``window_ms`` None: GPM off."""
    nvml = eight_h200s()
    fields = schema.fields_for([t for t in schema.TRACKING if t != "gpm"])
    if window_ms is not None:
        fields |= {(schema.GPU, f) for f in GPM_FIELDS}
    gpus = NvmlDevices(fields, nvml=nvml, pace=Pace(INTERVAL_MS / 1000, (window_ms or 100) / 1000))
    workers = []
    for i in range(GPUS):
        address = f"tcp://127.0.0.1:{40000 + i}"
        info = {"address": address, "pid": os.getpid(), "tags": {"host": "h", "worker": address}, "visible": str(i)}
        view = WorkerView(f"w{i}", info, _busy(), fields, offset=lambda: 0.0)
        view.uuids = gpus.resolve(view)
        workers.append(view)
    windows = []  # (CPU, replay excess) of each GPM read that took a sample, us
    for uuid in (u for w in workers for u in w.uuids):
        reader = gpus._devices[uuid].gpm_reader
        if reader is not None:
            reader.read = _timed(reader, nvml, windows)
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
        windows.clear()
        burned, excess, cpu = nvml.burned_us, nvml.excess_us, 0.0
        due = time.monotonic()
        for _ in range(ticks):  # paced as the agent samples: each tick finds the caches as a real one does
            due += INTERVAL_MS / 1000
            time.sleep(max(0.0, due - time.monotonic()))
            t0 = time.thread_time()
            sampler.sample_and_send()
            cpu += time.thread_time() - t0
            _empty(drain)  # not counted: Telegraf's work
    finally:
        sink.close()
        drain.close()
        gpus.close()
    ours = cpu * 1e6 - (nvml.excess_us - excess)
    return {
        "tick_us": ours / ticks,
        "nvml_us": (nvml.burned_us - burned) / ticks,
        "window_us": common.median([c - e for c, e in windows]) if windows else None,
        "windows": len(windows),
    }


def _timed(reader, nvml, windows: list):
    """``reader.read`` that records the CPU of each call that took a GPM sample (and the replay's excess)."""
    read = reader.read

    @functools.wraps(read)
    def timed():
        t0, e0, due = time.thread_time(), nvml.excess_us, reader.due()
        fields = read()
        if due:
            windows.append(((time.thread_time() - t0) * 1e6, nvml.excess_us - e0))
        return fields

    return timed


def _empty(sock) -> None:
    sock.setblocking(False)
    try:
        while True:
            sock.recv(65536)
    except BlockingIOError:
        pass


def run(quick: bool) -> list[dict]:
    ticks = 40 if quick else 100  # 5 s at 50 ms
    variants = {str(w): functools.partial(measure, w, ticks) for w in WINDOWS_MS}
    got = common.alternate({"off": functools.partial(measure, None, ticks), **variants}, rounds=1 if quick else 3)
    med = {v: {k: common.median([r[k] for r in runs]) for k in ("tick_us", "nvml_us")} for v, runs in got.items()}
    default = str(WINDOWS_MS[0])
    per_window = common.median([r["window_us"] for r in got[default]])
    prices = nvmlprices.nvml_prices("busy")
    floor = prices["nvmlGpmSampleGet"] + prices["nvmlGpmMetricsGet"]
    rows = [
        common.row(
            NAME,
            f"GPM per GPU and window ({default} ms, the default), {GPUS} replayed H200s: "
            "nvmlGpmSampleGet + nvmlGpmMetricsGet + our Python",
            round(per_window, 1),
            "us",
            baseline=round(floor, 1),
            target=f"<= {TARGET_US:.0f} us",
            met=per_window <= TARGET_US,
            notes=f"baseline: the two calls' price on the H200 (busy); median of {sum(r['windows'] for r in got[default])} "
            f"windows over {len(got[default])} runs; the replay's own Python left out",
        )
    ]
    off = med["off"]
    for window in variants:
        on = med[window]
        rows.append(
            common.row(
                NAME,
                f"{GPUS} replayed H200s, {GPUS} workers @{INTERVAL_MS} ms, GPM window {window} ms"
                + (" (default)" if window == default else "")
                + ": agent CPU per tick, GPM on vs off",
                round(on["tick_us"]),
                "us",
                baseline=round(off["tick_us"]),
                notes=f"+{100 * (on['tick_us'] / off['tick_us'] - 1):.1f} %; of which NVML's price "
                f"{on['nvml_us']:.0f} vs {off['nvml_us']:.0f} us",
            )
        )
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
