"""What the dashboard's GPU Jobs page costs: the bytes a worker adds to its heartbeat, the scheduler's CPU.

* **Heartbeat size.** A worker's entry (``names.LIVE_METRIC``, built as the agent and the worker build it:
  :class:`~dask_influx_metrics.sampling.live.LiveFigures` from one sample's points, then
  ``worker.heartbeat.from_beat``) plus Dask's three GPU figures, msgpack'd as Dask sends a heartbeat
  (``use_bin_type``): 1 GPU and 8 GPUs (a worker without ``CUDA_VISIBLE_DEVICES`` uses every GPU of its node),
  40-character NVML UUIDs, every field known (shared GPUs: shares, GPM, own memory), 4 jobs, 3 long task
  prefixes, two sinks (HTTP with its spool fallback). Target: <= 1 kB per worker and heartbeat.
* **Scheduler CPU.** 100 simulated workers x 8 GPUs, each heartbeat every 2 s (Dask's interval at 100
  workers) with a fresh entry decoded as Dask decodes one (tuples), staggered; the job plugin's poll every
  0.5 s (``LiveState.update`` of what ``_dask.heartbeats`` lists) over 10 simulated minutes (the 5-minute
  strips full, then pruned); thread CPU of the polls and of decoding our part of each heartbeat (msgpack,
  as Dask decodes it) over the simulated time. Target: <= 1 % of a core.
  Informational: one open page's redraw (``GpuJobsPage.update``: the jobs table, health, new strip bars)
  per 0.5 s with that state, and the agent's and the worker's parts per rebuild / heartbeat.

Run: ``.venv/bin/python -m benchmarks.live [--quick]``.
"""

from __future__ import annotations

import json
import random
import time
import types
import uuid

import msgpack

from benchmarks import common

NAME = "live"
SIZE_TARGET = 1024  # bytes per worker and heartbeat
CPU_TARGET = 1.0  # % of one core
WORKERS, GPUS, HEARTBEAT_S, POLL_S = 100, 8, 2.0, 0.5
PREFIXES = ("train-epoch-featurize-shard", "read-parquet-fused-assign", "matmul-bf16-accumulate")


class _View:
    def __init__(self, wid: str, address: str, uuids: list, jobs: int):
        from dask_influx_metrics.link.snapshot import Snapshot

        self.id, self.address, self.uuids = wid, address, uuids
        running = tuple(((PREFIXES[i % 3] + f"-{uuid.uuid4().hex}", i), 1 + i % jobs, 10 + i) for i in range(8))
        self._snap = Snapshot(running, 8, 0, 1)

    def snapshot(self):
        return self._snap


def _points(view, rng: random.Random) -> list:
    from dask_influx_metrics.schema import GPU, Point

    fields = lambda: {  # noqa: E731  (every field the live figures take, as NVML gives them)
        "utilization_gpu": float(rng.randint(0, 100)),
        "memory_used": rng.uniform(1000, 80000),
        "memory_total": 81559.0,
        "sm_active": rng.uniform(0, 100),
        "worker_gpu_share": rng.uniform(0, 100),
        "worker_memory_used": rng.uniform(500, 40000),
    }
    return [Point(GPU, {"worker": view.address, "uuid": u}, fields(), 0) for u in view.uuids]


def _accounting(jobs: int, rng: random.Random) -> dict:
    """What ``Accounting.live()`` gives on a host of 8 GPUs where ``jobs`` jobs have run (weeks of totals)."""
    gpus = [f"GPU-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(8)]
    return {
        "jobs": {
            str(job): {
                "gpus": {
                    u: {"busy_seconds": rng.uniform(1e4, 1e6), "energy_joules": rng.uniform(1e6, 1e9)} for u in gpus
                },
                "now": {
                    u: {
                        "utilization_gpu": rng.uniform(0, 100),
                        "sm_active": rng.uniform(0, 100),
                        "memory_bytes": rng.uniform(1e9, 8e10),
                    }
                    for u in gpus
                },
            }
            for job in range(1, jobs + 1)
        }
    }


def heartbeat_entry(gpus: int, jobs: int = 4, seed: int = 0, uuids: list | None = None, acct_jobs: int = 0) -> dict:
    """One worker's full heartbeat contribution (our entry and Dask's three GPU figures); its GPUs ``uuids``
    (default: ``gpus`` random ones); ``acct_jobs``: it is its host's relay worker, carrying the accounting
    of that many jobs."""
    from dask_influx_metrics.names import LIVE_METRIC
    from dask_influx_metrics.sampling.live import LiveFigures
    from dask_influx_metrics.worker.heartbeat import dask_gpu, from_beat

    rng = random.Random(seed)
    uuids = uuids or [f"GPU-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(gpus)]
    view = _View("4242", "tcp://10.0.0.17:39811", uuids, jobs)
    figures = LiveFigures()
    figures.update([view], _points(view, rng), now=0.0, shared=set(view.uuids))
    counters = [
        {
            "kind": "http",
            "points_written": 912_345_678,
            "points_failed": 1234,
            "points_spooled": 1200,
            "points_refused": 3,
        },
        {"kind": "spool", "points_written": 912_345_678, "points_dropped": 0},
    ]
    if acct_jobs:  # the host's per-job accounting, 8 GPUs of it: what the relay worker adds
        figures.account(_accounting(acct_jobs, rng))
    beat = {"pid": 123456, "samples": 7_654_321, "time": 0.0, "counters": counters, "live": figures.entries}
    beat.update(relay="4242", acct=figures.accounting)
    entry = from_beat(beat, "4242", "gpu-node-017.cluster.example.org", now=0.137)
    return {LIVE_METRIC: entry, **dask_gpu(entry)}


def heartbeat_bytes(gpus: int, acct_jobs: int = 0) -> int:
    return len(msgpack.packb(heartbeat_entry(gpus, acct_jobs=acct_jobs), use_bin_type=True))


def _cluster(seed: int = 1):
    """A stand-in scheduler: ``workers`` (address -> last_seen, metrics) and the heartbeats to come."""
    from dask_influx_metrics.names import LIVE_METRIC

    rng = random.Random(seed)
    workers, entries = {}, {}
    for i in range(WORKERS):
        address = f"tcp://10.0.{i // 8}.{i % 8}:4{i:04d}"
        uuids = [f"GPU-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(GPUS)]
        variants = [heartbeat_entry(GPUS, seed=seed * 1000 + i * 10 + k, uuids=uuids)[LIVE_METRIC] for k in range(4)]
        entries[address] = [msgpack.packb(e, use_bin_type=True) for e in variants]
        workers[address] = types.SimpleNamespace(last_seen=0.0, metrics={}, phase=rng.uniform(0, HEARTBEAT_S))
    return types.SimpleNamespace(workers=workers), entries


def scheduler_cpu(minutes: float) -> dict:
    """Thread CPU of the plugin's polls per simulated second, with 100 x 8 GPUs; and one page's redraw."""
    from dask_influx_metrics import _dask
    from dask_influx_metrics.names import LIVE_METRIC
    from dask_influx_metrics.scheduler.livestate import LiveState

    scheduler, entries = _cluster()
    state, cpu_ns, polls = LiveState(), 0, 0
    t0 = 1.8e9
    for k in range(int(minutes * 60 / POLL_S)):
        now = t0 + k * POLL_S
        start = time.thread_time_ns()
        for address, ws in scheduler.workers.items():  # the heartbeats that came since the last poll
            due = ws.phase + HEARTBEAT_S * int((now - t0 - ws.phase) // HEARTBEAT_S) if now - t0 >= ws.phase else None
            if due is not None and t0 + due > ws.last_seen:  # our part of it decoded as Dask decodes it
                ws.last_seen = t0 + due
                packed = entries[address][int(due / HEARTBEAT_S) % 4]
                ws.metrics = {LIVE_METRIC: msgpack.unpackb(packed, raw=False, use_list=False)}
        state.update(_dask.heartbeats(scheduler, LIVE_METRIC), now)
        cpu_ns += time.thread_time_ns() - start
        polls += 1
    simulated = minutes * 60
    page = _page_cost(scheduler, state, t0 + simulated)
    return {
        "percent": 100 * cpu_ns / 1e9 / simulated,
        "per_poll_us": cpu_ns / 1e3 / polls,
        "strips": len(state.strips),
        "bars": sum(len(s) for s in state.strips.values()),
        "page_us": page,
    }


def _page_cost(scheduler, state, now: float) -> float:
    """Median thread-CPU us of one open page's redraw after new heartbeats (100 x 8 GPUs; 32 strips drawn)."""
    from dask_influx_metrics import _dask
    from dask_influx_metrics.names import JOBS_PLUGIN, LIVE_METRIC
    from dask_influx_metrics.scheduler.dashboard import GpuJobsPage
    from dask_influx_metrics.scheduler.jobs import JobBook

    book = JobBook("client")
    for job in range(1, 5):
        book.submit(f"Client-{job}", [f"k-{job}"], now=now)
    plugin = types.SimpleNamespace(live=state, book=book, session={"id": "s"}, last_session=None, destinations={})
    scheduler.plugins = {JOBS_PLUGIN: plugin}
    page = GpuJobsPage(scheduler)
    page.update()
    costs = []
    for k in range(1, 21):
        for ws in list(scheduler.workers.values())[k % 4 :: 4]:  # a quarter of the workers beat per 0.5 s
            ws.last_seen = now + k * POLL_S
            ws.metrics = dict(ws.metrics)
        state.update(_dask.heartbeats(scheduler, LIVE_METRIC), now + k * POLL_S)
        start = time.thread_time_ns()
        page.update()
        costs.append((time.thread_time_ns() - start) / 1e3)
    return common.median(costs)


def side_costs() -> dict:
    """The agent's rebuild of 8 workers' entries (1 GPU each) and one worker's heartbeat entries, in us."""
    from dask_influx_metrics.sampling.live import LiveFigures
    from dask_influx_metrics.worker.heartbeat import dask_gpu, from_beat

    rng = random.Random(3)
    views = [_View(str(i), f"tcp://10.0.0.1:{40000 + i}", [f"GPU-{uuid.uuid4()}"], 2) for i in range(8)]
    points = [p for v in views for p in _points(v, rng)]
    figures = LiveFigures()
    agent = common.cpu_us(lambda: figures.update(views, points, now=0.0), 200)
    observe = common.cpu_us(lambda: figures.observe(points, now=0.0), 2000)
    beat = {"pid": 1, "samples": 1, "time": 0.0, "counters": [], "live": figures.entries}
    # what the entries add to the beat's slow part, encoded by the agent and decoded by each worker when it changes
    doc = json.dumps(beat, separators=(",", ":"))
    bare = json.dumps({k: v for k, v in beat.items() if k != "live"}, separators=(",", ":"))
    decode = common.cpu_us(lambda: json.loads(doc), 2000) - common.cpu_us(lambda: json.loads(bare), 2000)

    def worker():
        entry = from_beat(beat, "3", "node", 0.1)
        for _ in range(3):  # each of Dask's three GPU figures asks
            dask_gpu(entry)

    return {
        "agent_us": agent,
        "observe_us": observe,
        "decode_us": decode,
        "doc_bytes": len(doc) - len(bare),
        "worker_us": common.cpu_us(worker, 2000),
    }


def run(quick: bool) -> list[dict]:
    rows = []
    for gpus, acct in ((1, 0), (8, 0), (1, 16), (8, 16)):
        size = heartbeat_bytes(gpus, acct)
        relay = f", the host's relay: + accounting of {acct} jobs" if acct else ""
        rows.append(
            common.row(
                NAME,
                f"heartbeat bytes per worker, {gpus} GPU(s), 4 jobs running, every field{relay}",
                size,
                "bytes",
                target=f"<= {SIZE_TARGET}",
                met=size <= SIZE_TARGET,
                notes="msgpack (use_bin_type) of the live entry + Dask's three GPU figures",
            )
        )
    cpu = scheduler_cpu(2.0 if quick else 10.0)
    rows.append(
        common.row(
            NAME,
            f"scheduler CPU keeping the page's state, {WORKERS} workers x {GPUS} GPUs, heartbeats every {HEARTBEAT_S:g} s",
            round(cpu["percent"], 4),
            "% of a core",
            target=f"<= {CPU_TARGET:g} %",
            met=cpu["percent"] <= CPU_TARGET,
            notes=(
                f"polls every {POLL_S:g} s over {2 if quick else 10} simulated minutes: {cpu['per_poll_us']:.0f} us a poll; "
                f"{cpu['strips']} strips, {cpu['bars']} bars kept"
            ),
            details=cpu,
        )
    )
    rows.append(
        common.row(
            NAME,
            "one open page's redraw after new heartbeats (100 x 8 GPUs, 32 strips drawn)",
            round(cpu["page_us"]),
            "us",
            notes=f"every {POLL_S:g} s while the page is open: {cpu['page_us'] / POLL_S / 1e4:.2f} % of a core per page",
        )
    )
    side = side_costs()
    rows.append(
        common.row(
            NAME, "agent: rebuild 8 workers' entries (1 GPU each), every 0.5 s", round(side["agent_us"], 1), "us"
        )
    )
    rows.append(
        common.row(NAME, "agent: note a sample's shares (8 GPUs), every sample", round(side["observe_us"], 2), "us")
    )
    rows.append(
        common.row(
            NAME,
            "worker: decode the beat's live part (8 workers), when it changes (<= 2 a second)",
            round(side["decode_us"], 1),
            "us",
            notes=f"{side['doc_bytes']} bytes of JSON more in the beat",
        )
    )
    rows.append(
        common.row(
            NAME, "worker: its heartbeat entries (ours + Dask's 3 GPU figures)", round(side["worker_us"], 1), "us"
        )
    )
    return rows


if __name__ == "__main__":
    common.standalone(NAME, run)
