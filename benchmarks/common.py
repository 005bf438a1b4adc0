"""Helpers shared by the benchmark modules: result rows, the table, statistics, alternated runs,
a simulated worker's sampler and what a worker's monitor costs (the receiving end: :mod:`.receivers`).

Result rows (what every ``run(quick) -> list[dict]`` returns) are built by
:func:`row`; the keys are documented in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import statistics
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")
ROW_KEYS = ("name", "what", "measured", "unit", "baseline", "ratio", "target", "met", "notes")
# what the writers tag every point with (the session id has its real length: 29 characters)
TAGS = {
    "host": socket.gethostname(),
    "worker": "tcp://127.0.0.1:40000",
    "job": "1",
    "dag": "3",
    "session": "20261128T153000-000001-3fa9c2",
}


# -- result rows ---------------------------------------------------------------
def row(name, what, measured, unit, baseline=None, target=None, met=None, notes="", details=None) -> dict:
    """One result row; ``ratio`` is measured / baseline when both are numbers."""
    ratio = None
    if isinstance(measured, (int, float)) and isinstance(baseline, (int, float)) and baseline:
        ratio = measured / baseline
    out = {
        "name": name,
        "what": what,
        "measured": measured,
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "met": met,
        "notes": notes,
    }
    if details is not None:
        out["details"] = details
    return out


def failed_row(name, error: BaseException) -> dict:
    return row(name, "benchmark crashed", None, "", met=False, notes=f"{type(error).__name__}: {error}")


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: list[dict]) -> str:
    """The rows as a fixed-width text table (notes on a line of their own)."""
    head = ["benchmark", "what", "measured", "unit", "baseline", "ratio", "target", "met?"]
    body = [
        [
            r["name"],
            r["what"],
            _fmt(r["measured"]),
            r["unit"] or "",
            _fmt(r["baseline"]),
            "-" if r["ratio"] is None else f"{r['ratio']:.3f}x",
            r["target"] or "-",
            "-" if r["met"] is None else _fmt(bool(r["met"])),
        ]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(head), line(["-" * w for w in widths])]
    for r, cells in zip(rows, body):
        out.append(line(cells))
        if r.get("notes"):
            out.append(" " * (widths[0] + 2) + "  note: " + r["notes"])
    return "\n".join(out)


def environment() -> dict:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "host": socket.gethostname(),
        "loadavg": os.getloadavg(),
    }


def write_json(path: str, payload: dict) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    os.replace(tmp, path)
    return path


def standalone(name: str, run) -> None:
    """``python -m benchmarks.<name> [--quick]``: run one module, print it, write results/<name>.json."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}")
    p.add_argument("--quick", action="store_true", help="short durations (smoke test)")
    args = p.parse_args()
    t0 = time.monotonic()
    rows = run(args.quick)
    took = time.monotonic() - t0
    print(format_table(rows))
    path = write_json(
        os.path.join(RESULTS_DIR, f"{name}.json"),
        {"quick": args.quick, "env": environment(), "seconds": took, "rows": rows},
    )
    print(f"\n{name}: {took:.1f} s; wrote {path}")


# -- statistics ----------------------------------------------------------------
def package_at(ref: str, name: str) -> tuple[str, str]:
    """(folder, ``name``): ``dask_influx_metrics/`` of git ``ref`` as package ``name`` in a new temporary folder
    (put the folder on ``sys.path`` to import it beside this checkout's; remove the folder after). Raises
    ``CalledProcessError`` or ``OSError`` where there is no git history (a shallow clone, an sdist)."""
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"{name}-")
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", ref, "dask_influx_metrics"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    os.rename(os.path.join(folder, "dask_influx_metrics"), os.path.join(folder, name))
    return folder, name


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def percentile(xs, q: float):
    """Nearest-rank percentile (``q`` in 0..100) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(math.ceil(q / 100 * len(s))) - 1))] if s else float("nan")


def median_interval(xs, level: float = 0.95) -> tuple | None:
    """A distribution-free interval for the median of ``xs``: the order statistics k and n+1-k for the largest
    k whose coverage (binomial, as the sign test's) is at least ``level``; None when ``xs`` are too few for it
    (fewer than 6 at 95 %). Nine rounds give [2nd, 8th] of the sorted values (96 %).

    >>> median_interval([1.0, 1.1, 0.9, 1.2, 1.05, 0.95, 1.0, 1.3, 0.8])
    (0.9, 1.2)
    """
    s, n = sorted(xs), len(xs)
    below, k = 0.0, 0  # below: P(fewer than k+1 of n values fall below the median)
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if 1 - 2 * below < level:
            break
        k += 1
    return (s[k - 1], s[n - k]) if k else None


def cpu_us(fn, n: int) -> float:
    """Median thread-CPU microseconds of ``n`` calls of ``fn``."""
    out = []
    for _ in range(n):
        t = time.thread_time_ns()
        fn()
        out.append((time.thread_time_ns() - t) / 1000)
    return median(out)


def alternate(variants: dict, rounds: int) -> dict:
    """Call each ``variants[name]()`` once per round, in rotation; collect what each returns."""
    out = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            out[name].append(fn())
    return out


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


# -- which GPU source (``python -m benchmarks --gpu-source nvml``) ----------------------
def gpu_source() -> str:
    """``simulated`` (default) or ``nvml``: set by ``--gpu-source`` (env ``BENCH_GPU_SOURCE``)."""
    return os.environ.get("BENCH_GPU_SOURCE", "simulated")


def gpu_settings(gpu_count: int = 8) -> dict:
    """Monitor keyword arguments for the selected GPU source."""
    return {"gpu_source": "nvml"} if gpu_source() == "nvml" else {"gpu_source": "simulated", "gpu_count": gpu_count}


def gpus_label(count: int) -> str:
    """How the GPUs a benchmark samples are named in its notes: ``8 simulated GPUs``, or NVML's."""
    return "this node's GPUs (NVML)" if gpu_source() == "nvml" else f"{count} simulated GPU{'s' * (count != 1)}"


def skipped_without_nvml(name: str) -> list[dict] | None:
    """One "skipped" row when ``--gpu-source nvml`` was asked for on a machine without an NVML GPU, else None."""
    from dask_influx_metrics.sampling.sources.nvml_devices import nvml_available

    if gpu_source() != "nvml" or nvml_available():
        return None
    return [
        row(
            name,
            "skipped: --gpu-source nvml, but NVML sees no GPU here",
            None,
            "",
            notes="rerun on a GPU node, or without --gpu-source for the simulated devices",
        )
    ]


# -- a simulated worker --------------------------------------------------------
def simulated_worker(
    sink, gpu_count: int = 8, tracking=None, psutil_reads: bool = True, interval_ms: float | None = None
):
    """(sampler, parts) for one worker sampled as ``sampler.mode: thread`` does: GPUs, host/process, tasks;
    every metric by default.

    The GPUs are ``gpu_count`` simulated devices, or this node's real ones
    through NVML with ``--gpu-source nvml`` (``gpu_count`` ignored).
    ``psutil_reads=False``: no host or worker-process fields. ``parts``:
    ``snapshot`` (the cache), ``gpus`` (the backend), ``view`` (the worker),
    ``host`` (the host source, or None) and ``collector``. ``interval_ms``:
    sample at this polling interval with the default ``sampler.host-refresh``,
    as a worker does; None: back to back, every sample reads the host counters.
    """
    from dask_influx_metrics import config, schema
    from dask_influx_metrics.sampling.collect import HostCollector
    from dask_influx_metrics.sampling.gpus import SimulatedDevices
    from dask_influx_metrics.sampling.sampler import Sampler
    from dask_influx_metrics.sampling.sources.host import HostSource, refresh_seconds
    from dask_influx_metrics.sampling.view import WorkerView
    from dask_influx_metrics.worker.registry import CachedSnapshot, TaskRegistry

    reg = TaskRegistry(nthreads=8, managed_bytes=lambda: 3 << 30)
    for i in range(6):
        reg.started(("task", i), 1, 3)
    snapshot = CachedSnapshot(reg)
    fields = schema.fields_for(tracking if tracking is not None else schema.TRACKING)
    if not psutil_reads:
        fields = frozenset(f for f in fields if f[0] != schema.HOST and f not in PROCESS_FIELDS)
    if gpu_source() == "nvml":
        from dask_influx_metrics.sampling.sources.nvml import NvmlDevices

        gpus = NvmlDevices(fields)
    else:
        gpus = SimulatedDevices(gpu_count, fields)
    own = {k: TAGS[k] for k in ("host", "worker", "session")}
    info = {"address": TAGS["worker"], "pid": os.getpid(), "tags": own}
    view = WorkerView("bench", info, snapshot, fields, offset=lambda: 0.0)
    view.uuids = gpus.resolve(view)
    refresh = 0.0 if interval_ms is None else refresh_seconds(config.Settings.resolve({}).host_refresh, interval_ms)
    host_fields = frozenset(f for f in fields if f[0] == schema.HOST)
    host = HostSource(host_fields, refresh=refresh) if host_fields else None
    collector = HostCollector(fields, gpus, host)

    def collect(now_ns: int) -> list:
        snapshot.refresh()
        return collector.collect([view], now_ns)

    parts = {"snapshot": snapshot, "gpus": gpus, "view": view, "host": host, "collector": collector}
    return Sampler(collect, sink, interval=(interval_ms or 200) / 1000.0), parts


PROCESS_FIELDS = frozenset({("worker", "cpu_percent"), ("worker", "rss")})  # what psutil reads of a worker


def sample_lines(gpu_count: int = 8) -> list[bytes]:
    """The encoded lines of one full sample (every metric, ``gpu_count`` GPUs)."""
    from dask_influx_metrics import lineprotocol

    sampler, _ = simulated_worker(None, gpu_count)
    return lineprotocol.encode_many(sampler.sample())


def first_fields(lines: list[bytes]) -> dict:
    """{measurement: first field key} of the given lines (for counting points in influxd)."""
    from dask_influx_metrics import lineparse

    out = {}
    for line in lines:
        p = lineparse.parse(line)
        out.setdefault(p.measurement, next(iter(p.fields)))
    return out


# -- a monitored Dask worker (functions for client.run) -----------------------------
def has_sampler_mode() -> bool:
    """Whether the installed package has ``sampler.mode`` (agent: one sampling process per host)."""
    from dask_influx_metrics import config

    return "sampler_mode" in getattr(config, "KWARGS", {})


def own_sampler(plugin):
    """A worker's in-process sampler (``sampler.mode: thread``: its host-sampling core's), or None; an older
    package kept it as ``plugin.sampler``."""
    core = getattr(plugin, "core", None)
    return core.sampler if core is not None else getattr(plugin, "sampler", None)


def in_worker_costs(dask_worker):
    """The in-process sampler's CPU seconds per sample (None when the host's agent samples, or none runs)."""
    plugin = dask_worker.plugins.get("influx-metrics")
    sampler = own_sampler(plugin)
    if sampler is None or getattr(plugin, "link", None) is not None:
        return None
    return list(sampler.costs)


def agent_pid(dask_worker) -> int | None:
    """The pid of the host agent sampling this worker, from the agent's beat (None: none samples it)."""
    link = getattr(dask_worker.plugins.get("influx-metrics"), "link", None)
    beat = link.beat() if link is not None else None
    return beat["pid"] if beat else None


def monitor_threads(dask_worker) -> list[tuple[int, int]]:
    """(pid, native thread id) of the threads the monitor runs in this worker (named ``influx-metrics-*``)."""
    import threading

    return [(os.getpid(), t.native_id) for t in threading.enumerate() if t.name.startswith("influx-metrics-")]


def threads_cpu_ns(threads) -> int:
    """CPU nanoseconds the (pid, thread id) ``threads`` have run (a thread that ended counts 0)."""
    total = 0
    for pid, tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # ended meanwhile
            pass
    return total


def process_cpu_ns(pid: int) -> int:
    """CPU nanoseconds all threads of process ``pid`` have run (0 once it is gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    return threads_cpu_ns((pid, tid) for tid in tids)


def worker_cpu_seconds(dask_worker) -> dict:
    """CPU seconds of this worker process and of the host agent sampling it (its pid from the agent's beat),
    by pid: the agent is not the worker's child (a launcher forks it and exits) and serves every worker of
    its host, so :func:`cluster_cpu_seconds` counts it once."""
    return {pid: process_cpu_ns(pid) / 1e9 for pid in {os.getpid(), agent_pid(dask_worker)} - {None}}


def cluster_cpu_seconds(client) -> float:
    """CPU seconds so far of the client's worker processes and of their hosts' agents, each process once."""
    per_pid: dict = {}
    for cpu in client.run(worker_cpu_seconds).values():
        per_pid.update(cpu)
    return sum(per_pid.values())
