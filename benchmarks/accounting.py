"""What per-job GPU accounting costs (issue 49): per GPU and sample in the agent, per scrape, in the workers.

1. **Agent, per sample.** One :class:`HostCollector` over :class:`NvmlDevices` on the H200 recording in the
   fake's cost mode (``tests/fake_nvml.py``: each NVML call spends the CPU it cost on a real H200), copied
   to 8 GPUs, 16 workers (two per GPU, each running its own job: 16 jobs), every metric, on a simulated
   200 ms clock (so the per-process read comes once a second and the points every 10 s, as in production).
   Rounds alternate the collector with accounting and without; each round's cost is the median thread CPU of
   ``collect()`` + encoding over its samples; the accounting's own part is also timed inside
   (``Accounting.update``). Target: <= 20 us per GPU per sample.
2. **A scrape** of ``/metrics`` with 8 GPUs x 16 jobs, every job on every GPU: dask-cuda's layout (8 workers,
   one GPU each, every job on each) and the most series (16 workers each seeing all 8 GPUs): a child process
   holds that accounting and serves it (``agent/prometheus.py``); the CPU of that process per HTTP scrape
   (``/proc/<pid>/stat``: its threads, the server's per-request ones too), against the same process serving an
   empty registry (the HTTP server's own floor). Target: <= 5 ms.
3. **Workers.** A LocalCluster of 2 worker processes (agent mode, 8 simulated GPUs each, 100 ms, UDP into
   a socket nobody reads), alternating the tracking list with and without ``accounting``: each worker
   process's CPU per sample (``/proc/<pid>/task/*/schedstat``). Target: nothing added (the ratio ~1,
   within the noise of the off/off spread printed beside it).

``python -m benchmarks.accounting [--quick]``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import socket
import sys
import time
import urllib.request

from benchmarks import common
from benchmarks.common import process_cpu_ns

NAME = "accounting"
PROMETHEUS = "prometheus_client"  # the /metrics part needs it (extra [prometheus])
GPUS, JOBS, STEP = 8, 16, 0.2
PER_GPU_TARGET_US, SCRAPE_TARGET_MS = 20.0, 5.0
TESTS = os.path.join(common.ROOT, "tests")


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def wall(self):
        return 1_795_751_870.0 + self.t


class _Worker:
    def __init__(self, n: int, pid: int, gpu: int | None, jobs: tuple):
        from dask_influx_metrics.link.snapshot import Snapshot

        self.id, self.pid, self.address = f"{n:03d}", pid, f"tcp://10.0.0.1:{40000 + n}"
        self.visible = None if gpu is None else str(gpu)  # None: every GPU
        self.tags = {"host": "node", "worker": self.address}
        self.snap = Snapshot(tuple((f"task-{n}-{j}", j, j) for j in jobs), len(jobs), 0, jobs[-1])
        self.uuids: list = []

    def snapshot(self):
        return self.snap

    def offset(self):
        return 0.0

    def read(self, snap=None):
        return {"cpu_percent": 12.5}


LAYOUTS = {
    "pairs": "16 workers, two per GPU, each running its own job",
    "dask-cuda": "8 workers, one GPU each, each running a task of every job",
    "every": "16 workers each seeing all 8 GPUs, each running its own job",
}


def harness(accounting: bool, layout: str = "pairs"):
    """``(sample(k) -> lines, the Accounting or None)``: the 8-GPU, 16-job host of :data:`LAYOUTS`."""
    sys.path.insert(0, TESTS)
    from fake_nvml import FakeNvml

    from dask_influx_metrics import lineprotocol, schema
    from dask_influx_metrics.sampling.accounting import Accounting
    from dask_influx_metrics.sampling.collect import HostCollector
    from dask_influx_metrics.sampling.sources.nvml import NvmlDevices

    fields = schema.fields_for(schema.TRACKING)
    nvml = FakeNvml("nvml_h200_shared.json", cost="idle").with_gpus(GPUS)
    gpus = NvmlDevices(frozenset(f for f in fields if f[0] == schema.GPU), nvml=nvml)
    if layout == "dask-cuda":
        workers = [_Worker(g, 666, g, tuple(range(1, JOBS + 1))) for g in range(GPUS)]
    else:
        workers = [_Worker(j, (666, 668)[j % 2], None if layout == "every" else j // 2, (j + 1,)) for j in range(JOBS)]
    clock = _Clock()
    for w in workers:
        w.uuids = gpus.resolve(w)
    for dev in gpus._devices.values():  # the readers paced by the simulated clock
        dev.procs._clock, dev.procs._wall, dev.slow._clock = clock, clock.wall, clock
        if dev.gpm_reader is not None:
            dev.gpm_reader._clock = clock
    acc = Accounting(10.0, STEP, {"host": "node", "worker": "agent-node"}, clock=clock) if accounting else None
    collector = HostCollector(fields, gpus, None, accounting=acc)

    def sample(k: int) -> list[bytes]:
        clock.t = k * STEP
        return lineprotocol.encode_many(collector.collect(workers, now_ns=int(clock.wall() * 1e9)))

    return sample, acc


def per_sample(samples: int, rounds: int) -> dict:
    """{"with": [median us per sample per round], "without": [...], "update": [us in Accounting.update]}."""
    out: dict = {"with": [], "without": [], "update": []}
    for _ in range(rounds):
        for variant in ("with", "without"):
            sample, acc = harness(variant == "with")
            spent = []
            if acc is not None:
                real = acc.update

                def timed(*args, **kw):
                    t = time.thread_time_ns()
                    try:
                        return real(*args, **kw)
                    finally:
                        spent.append((time.thread_time_ns() - t) / 1000)

                acc.update = timed
            costs = []
            for k in range(samples):
                t = time.thread_time_ns()
                sample(k)
                costs.append((time.thread_time_ns() - t) / 1000)
            out[variant].append(common.median(costs[5:]))  # past the first samples (static reads)
            if spent:
                out["update"].append(common.median(spent[5:]))
    return out


def _process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid``, every thread it ran, ended ones too (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(conn, layout: str | None) -> None:
    """Child: serve /metrics of the accounting of ``layout`` (None: of nothing) until told to stop."""
    from dask_influx_metrics.agent import prometheus
    from dask_influx_metrics.config import Settings

    sample, acc = harness(True, layout or "pairs")
    for k in range(60):
        sample(k)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings.resolve({"prometheus.port": port, "prometheus.address": "127.0.0.1"})
    if layout is not None:
        endpoint = prometheus.serve(settings, acc, {"host": "node", "session": "20261128T120000-000001"}, _say)
    else:  # the HTTP server's own floor: the same server, a registry with nothing in it
        from prometheus_client import CollectorRegistry, start_http_server

        server, thread = start_http_server(port, addr="127.0.0.1", registry=CollectorRegistry())
        endpoint = prometheus.Endpoint(server, thread, port)
    if endpoint is None:  # not served: the report above says why
        conn.send(None)
        return
    conn.send(port)
    conn.recv()
    endpoint.close()


def _say(what: str, message: str, **details) -> None:
    print(f"[{NAME}] {what}: {message}")


def per_scrape(scrapes: int, rounds: int) -> dict:
    """{layout: [ms of the serving process's CPU per scrape, per round], "empty": [...], "series": {layout: n}}."""
    out: dict = {"dask-cuda": [], "every": [], "empty": [], "series": {}}
    ctx = multiprocessing.get_context("spawn")
    for _ in range(rounds):
        for variant in ("dask-cuda", "every", "empty"):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, None if variant == "empty" else variant))
            proc.start()
            child.close()  # the child's end is the child's: its exit ends parent.recv() (EOFError), never a hang
            try:
                try:
                    port = parent.recv()
                except EOFError:
                    raise RuntimeError(f"the /metrics server process exited before serving (exit code {proc.exitcode})")
                if port is None:
                    raise RuntimeError("/metrics was not served (the line above says why)")
                url = f"http://127.0.0.1:{port}/metrics"
                text = urllib.request.urlopen(url, timeout=10).read()  # the first: new series show 0
                cpu = _process_cpu_s(proc.pid)
                for _ in range(scrapes):
                    text = urllib.request.urlopen(url, timeout=10).read()
                out[variant].append((_process_cpu_s(proc.pid) - cpu) / scrapes * 1000)
                if variant != "empty":
                    lines = text.decode().splitlines()
                    out["series"][variant] = sum(1 for line in lines if line and not line.startswith("#"))
            finally:
                with contextlib.suppress(OSError):  # a child that died has nothing to stop
                    parent.send("stop")
                proc.join(30)
    return out


def _probe(dask_worker):
    plugin = dask_worker.plugins.get("influx-metrics")
    beat = plugin.link.beat() if plugin is not None and plugin.link is not None else None
    return os.getpid(), (beat or {}).get("samples", 0)


def in_workers(seconds: float, rounds: int) -> dict:
    """{variant: [worker us per sample, per round]} with and without accounting (2 workers, agent mode)."""
    from distributed import Client, LocalCluster

    from dask_influx_metrics import Monitor, schema

    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    address = "%s:%d" % receiver.getsockname()
    without = [t for t in schema.TRACKING if t != "accounting"]
    try:
        with (
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
            Client(cluster) as client,
        ):

            def one(tracking):
                m = Monitor(client, sink="udp", telegraf_address=address, gpu_source="simulated", gpu_count=8)
                m.attach(polling_interval=100, tracking=tracking)
                m.start()
                try:
                    time.sleep(1.0)
                    before = client.run(_probe)
                    cpu0 = {w: process_cpu_ns(pid) for w, (pid, _) in before.items()}
                    time.sleep(seconds)
                    after = client.run(_probe)
                    cpu = sum(process_cpu_ns(pid) - cpu0[w] for w, (pid, _) in after.items()) / len(after)
                    samples = max(1, min(s for _, s in after.values()) - max(s for _, s in before.values()))
                finally:
                    m.shutdown()
                return cpu / 1000 / samples

            runs = common.alternate({"with": lambda: one(None), "without": lambda: one(without)}, rounds)
    finally:
        receiver.close()
    return runs


def run(quick: bool = False) -> list[dict]:
    samples, rounds = (60, 3) if quick else (300, 7)
    agent = per_sample(samples, rounds)
    with_us, without_us, update_us = (common.median(agent[k]) for k in ("with", "without", "update"))
    scrape = per_scrape(20 if quick else 100, 2 if quick else 5) if importlib.util.find_spec(PROMETHEUS) else None
    workers = in_workers(3.0 if quick else 10.0, 2 if quick else 4)
    w_with, w_without = common.median(workers["with"]), common.median(workers["without"])
    per_gpu = update_us / GPUS
    return [
        common.row(
            NAME,
            f"agent: Accounting.update per GPU per sample ({GPUS} GPUs, {JOBS} jobs, H200 cost mode)",
            per_gpu,
            "us",
            target=PER_GPU_TARGET_US,
            met=per_gpu <= PER_GPU_TARGET_US,
            notes=f"median of {rounds} rounds of {samples} samples: {update_us:.0f} us per sample",
            details=agent,
        ),
        common.row(
            NAME,
            "agent: collect + encode per sample, with accounting vs without",
            with_us,
            "us",
            baseline=without_us,
            notes=f"difference {(with_us - without_us) / GPUS:.1f} us per GPU (NVML's burn included in both)",
            details=agent,
        ),
        *_scrape_rows(scrape),
        common.row(
            NAME,
            "worker process CPU per sample, tracking with accounting vs without (agent mode)",
            w_with,
            "us",
            baseline=w_without,
            notes="accounting runs in the agent only; the workers' code path is the same",
            details=workers,
        ),
    ]


def _scrape_rows(scrape: dict | None) -> list[dict]:
    """The /metrics rows; one "skipped" row where ``prometheus_client`` is not installed (``scrape`` None)."""
    if scrape is None:
        return [
            common.row(
                NAME,
                "agent CPU per /metrics scrape: skipped",
                None,
                "ms",
                notes=f"{PROMETHEUS} is not importable: pip install 'dask-influx-metrics[prometheus]' to measure it",
            )
        ]
    empty = common.median(scrape["empty"])
    return [
        common.row(
            NAME,
            f"agent CPU per /metrics scrape, {GPUS} GPUs x {JOBS} jobs: {LAYOUTS[layout]} "
            f"({scrape['series'][layout]} series)",
            common.median(scrape[layout]),
            "ms",
            baseline=empty,
            target=SCRAPE_TARGET_MS,
            met=common.median(scrape[layout]) <= SCRAPE_TARGET_MS,
            notes="baseline: the same HTTP server with an empty registry",
            details=scrape,
        )
        for layout in ("dask-cuda", "every")
    ]


if __name__ == "__main__":
    common.standalone(NAME, run)
