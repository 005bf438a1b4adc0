"""Sampler cost: CPU microseconds per sample on the sampling thread.

8 simulated GPUs, every built-in metric plus tasks, sent through the UDP sink
(into a bound loopback socket nobody reads: the kernel drops, the sender
does not notice); split into read, encode, send, with the psutil
(host/process) reads apart and each psutil call on its own. Baseline in the
same run: the same sample with only the tasks source. A cProfile of the
sampling loop (top functions by cumulative time) is printed and kept in the
JSON ``details``. Then what the worker *process* pays per sample in the default
configuration (the host's agent samples; the worker publishes its task changes) and
in-process (``sampler.mode: thread``), against the same floor, and the agent's own cost
(:mod:`benchmarks.workerside`).

Run: ``.venv/bin/python -m benchmarks.sampler [--quick]`` (cost only), or
``.venv/bin/python benchmarks/sampler.py`` (cost, profile and the gap table of
:mod:`benchmarks.gaps`, as before).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import socket
import sys
import threading
import time

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402

NAME = "sampler"
TARGET_US = 200.0


def _udp_sink():
    from dask_influx_metrics.sinks.udp import UdpSink

    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    return receiver, UdpSink(receiver.getsockname())  # telegraf.max-datagram auto: 65507 on loopback


def cost_table(n: int = 2000) -> tuple[dict, dict]:
    """({row: median CPU us}, details) for the full sample and its parts."""
    from dask_influx_metrics import lineprotocol, schema
    from dask_influx_metrics.sampling.sources.host import HostSource

    receiver, sink = _udp_sink()
    try:
        full, parts = common.simulated_worker(sink)
        no_psutil, _ = common.simulated_worker(sink, psutil_reads=False)
        tasks_only, _ = common.simulated_worker(sink, tracking=["tasks", "worker-mem"], psutil_reads=False)
        points = full.sample()
        lines = lineprotocol.encode_many(points)
        gpus, uuids = parts["gpus"], parts["view"].uuids
        # the host and the worker process as the sample reads them, in one source (each group apart below)
        host = HostSource(schema.fields_for(schema.TRACKING))

        def read_gpus():
            gpus.start_sample()
            return [gpus.read(u) for u in uuids]

        rows = {
            "read (all sources)": common.cpu_us(full.sample, n),
            f"  of which {common.gpus_label(8)}": common.cpu_us(read_gpus, n),
            "  of which host + process (psutil)": common.cpu_us(
                lambda: (host.read(schema.HOST), host.read(schema.WORKER)), n
            ),
            "encode": common.cpu_us(lambda: lineprotocol.encode_many(points), n),
            "send (UDP)": common.cpu_us(lambda: sink.send(lines), n),
            "total per sample": common.cpu_us(full.sample_and_send, n),
            "total without psutil (GPU + tasks)": common.cpu_us(no_psutil.sample_and_send, n),
            "baseline: tasks source only": common.cpu_us(tasks_only.sample_and_send, n),
        }
        # each psutil group alone (HostSource keeps them in ``_calls``; benchmark-only peek)
        psutil_calls = {"/".join(key): common.cpu_us(call, n) for key, call in host._calls.items()}
        host.close()
    finally:
        receiver.close()
    return rows, {
        "lines_per_sample": len(lines),
        "bytes_per_sample": sum(map(len, lines)),
        "psutil_us_by_call": psutil_calls,
    }


def paced_cost(n: int, period: float) -> float:
    """Median CPU us of ``n`` samples taken ``period`` s apart (caches cold, as in a worker)."""
    receiver, sink = _udp_sink()
    try:
        full, _ = common.simulated_worker(sink)
        out = []
        for _ in range(n):
            time.sleep(period)
            out.append(common.cpu_us(full.sample_and_send, 1))
    finally:
        receiver.close()
    return common.median(out)


def thread_cpu_ns(native_id: int) -> int:
    """CPU nanoseconds a thread of this process has run (``/proc/self/task/<tid>/schedstat``)."""
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        return int(f.read().split()[0])


class Floor:
    """The floor of any in-process sampler: a thread that wakes every ``interval`` s (the same
    drift-free schedule as the Sampler) and sends one ~1 kB datagram, nothing else."""

    def __init__(self, address, interval: float):
        self.samples, self.interval = 0, interval
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._payload, self._address = b"x" * 1000, address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="floor", daemon=True)

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                self._sock.sendto(self._payload, self._address)
            except BlockingIOError:
                pass
            self.samples += 1
            due += self.interval
            self._stop.wait(max(0.0, due - time.monotonic()))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()


def per_tick_us(runner, seconds: float) -> float:
    """CPU us per tick of a started thread (``runner._thread``, ``runner.samples``) over ``seconds``."""
    tid = runner._thread.native_id
    time.sleep(min(1.0, seconds / 4))  # past the first ticks (imports, first reads)
    cpu, ticks = thread_cpu_ns(tid), runner.samples
    time.sleep(seconds)
    return (thread_cpu_ns(tid) - cpu) / 1000 / max(1, runner.samples - ticks)


def floor_table(seconds: float, rounds: int, interval: float = 0.05) -> dict:
    """{variant: [CPU us per tick, one per round]}: the floor thread and the Sampler thread
    (every metric, UDP) with 1 and 8 devices, all at ``interval``, alternated."""
    receiver, sink = _udp_sink()

    def floor():
        f = Floor(receiver.getsockname(), interval)
        f.start()
        try:
            return per_tick_us(f, seconds)
        finally:
            f.stop()

    def sampler(devices, host_refresh=True):
        if host_refresh:  # the default sampler.host-refresh, as in a worker
            full, _ = common.simulated_worker(sink, gpu_count=devices, interval_ms=interval * 1000)
        else:  # host counters read every sample
            full, _ = common.simulated_worker(sink, gpu_count=devices)
            full.interval = interval
        full.start()
        try:
            return per_tick_us(full, seconds)
        finally:
            full.stop()

    try:
        return common.alternate(
            {
                "floor": floor,
                "1 device": lambda: sampler(1),
                "8 devices": lambda: sampler(8),
                EVERY_SAMPLE: lambda: sampler(1, host_refresh=False),
            },
            rounds,
        )
    finally:
        receiver.close()


def profile(n: int = 2000, top: int = 22) -> str:
    """cProfile of ``n`` iterations of the sampling loop body; top functions by cumulative time."""
    receiver, sink = _udp_sink()
    try:
        full, _ = common.simulated_worker(sink)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            full.sample_and_send()
        prof.disable()
    finally:
        receiver.close()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.strip_dirs().sort_stats("cumulative").print_stats(top)
    text = out.getvalue()
    return text[text.index("   ncalls") :] if "   ncalls" in text else text


EVERY_SAMPLE = "1 device, host counters read every sample"
FLOOR_TARGETS = {"1 device": 3.0, "8 devices": 4.0, EVERY_SAMPLE: None}  # x the floor


def floor_rows(quick: bool) -> list[dict]:
    from benchmarks import workerside

    seconds, rounds = (2.0, 1) if quick else (8.0, 3)
    runs = floor_table(seconds, rounds)
    floor = common.median(runs.pop("floor"))
    devices = "NVML: this node's GPUs" if common.gpu_source() == "nvml" else "simulated"
    rows = [
        common.row(
            NAME,
            "floor: empty thread @50 ms sending one 1 kB datagram, CPU per tick",
            floor,
            "us",
            notes=(
                f"median of {rounds} runs of {seconds:.0f} s, alternated with the rows below; thread CPU "
                "from /proc/self/task/<tid>/schedstat, wake-up and wait included"
            ),
        )
    ]
    for variant, costs in runs.items():
        limit = FLOOR_TARGETS[variant]
        cost = common.median(costs)
        host = (
            "host counters read every sample"
            if variant == EVERY_SAMPLE
            else "host counters read every 4th sample (sampler.host-refresh 200 ms, the default)"
        )
        rows.append(
            common.row(
                NAME,
                f"in-process sampler thread @50 ms, {variant} ({devices}), every metric, CPU per sample vs floor",
                cost,
                "us",
                baseline=floor,
                target=limit and f"<= {limit:.0f}x floor",
                met=limit and cost <= limit * floor,
                notes=f"runs {', '.join(f'{c:.0f}' for c in costs)} us; {host}; one worker owns the host",
            )
        )
    return rows + workerside.rows(NAME, floor, quick)


def run(quick: bool = False) -> list[dict]:
    skipped = common.skipped_without_nvml(NAME)
    if skipped:
        return skipped
    n = 300 if quick else 2000
    costs, details = cost_table(n)
    n_paced, period = (20, 0.05) if quick else (100, 0.1)
    paced = paced_cost(n_paced, period)
    prof = profile(n)
    print(f"[sampler] cProfile of {n} samples ({common.gpus_label(8)}, every metric, UDP), by cumulative time:")
    print(prof)
    details["profile_top_cumulative"] = prof
    total, base = costs["total per sample"], costs["baseline: tasks source only"]
    psutil_us = costs["  of which host + process (psutil)"]
    calls = ", ".join(f"{k} {v:.0f}" for k, v in sorted(details["psutil_us_by_call"].items(), key=lambda kv: -kv[1]))
    rows = [
        common.row(
            NAME,
            "CPU per sample, total (read+encode+send)",
            total,
            "us",
            baseline=base,
            target=f"<= {TARGET_US:.0f} us",
            met=total <= TARGET_US,
            notes=(
                f"median of {n}; {details['lines_per_sample']} lines / {details['bytes_per_sample']} B per sample; "
                f"baseline = tasks source only; psutil reads {psutil_us:.0f} us of it ({calls})"
            ),
            details=details,
        )
    ]
    for what, value in costs.items():
        if what not in ("total per sample", "baseline: tasks source only"):
            label = what.strip() if not what.startswith("  ") else "- " + what.strip()
            rows.append(common.row(NAME, label + " [ratio vs total]", value, "us", baseline=total))
    rows.append(
        common.row(
            NAME,
            f"total per sample, one every {period * 1000:.0f} ms (cold caches)",
            paced,
            "us",
            baseline=total,
            notes=(
                f"median of {n_paced}; ratio vs the back-to-back median above: what the sampling thread "
                "costs in a worker, where other work evicts its caches between samples"
            ),
        )
    )
    return floor_rows(quick) + rows


def main() -> None:
    """The original script: cost table, profile, then the gap table."""
    from benchmarks import gaps

    rows = run(quick="--quick" in sys.argv) + gaps.run(quick="--quick" in sys.argv)
    print(common.format_table(rows))


if __name__ == "__main__":
    if __package__ in (None, ""):
        main()
    else:
        common.standalone(NAME, run)
