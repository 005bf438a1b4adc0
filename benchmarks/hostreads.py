"""What issue 47's node readings cost the agent: this checkout vs the package before it, alternated read by read.

Issue 47 added to the agent's host reads the per-core CPU spread (``/proc/stat``'s per-core lines,
from the read it already made), the network split loopback / external (``/proc/net/dev`` per
interface, the loopback flag read once per name) and the ``disk`` measurement (one ``statvfs`` per
filesystem the workers write to, once a second). **before** is ``git archive <ref>`` of
``dask_influx_metrics/`` (default ref :data:`BEFORE`, the commit issue 47 started from), imported in
this process under another name (``dim_before``); **now** is this checkout. Both run in one process,
their calls interleaved, so that both see the same machine at the same moments.

* **reads, per host refresh** (the target): what the agent reads each time its host counters are
  due, each read after a 10 ms sleep (as the agent wakes for a sample: caches cold): before's
  ``HostSource.read`` of every ``host`` field it declares, now's of every one it declares, and now's
  with ``DiskUsage.read`` of the agent's paths (a worker's ``local_directory``, the system temp
  folder, and the run folder, ``/dev/shm``) in the same wake, in rotating order; thread CPU, medians.
  Added per refresh = (now - before) + (the filesystems' part) x the share of refreshes that read
  them (1 s / the default 200 ms host refresh: 1 in 5).
* **sample path, per sample** (informational; the whole cost a sample pays): the agent's collect and
  encode for two worker views of this process (every metric of that version, no GPU) at the default
  200 ms host refresh and 50 ms interval (host counters read every 4th sample, the filesystems every
  20th; the new host fields encoded every sample), ``HostCollector.collect`` +
  ``lineprotocol.encode_many``, each sample after a 12.5 ms sleep, before and now alternating; thread
  CPU, the mean per sample.

Run: ``.venv/bin/python -m benchmarks.hostreads [--quick]`` (``BENCH_BEFORE=<ref>``).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import common

NAME = "hostreads"
BEFORE = "49cc40a"  # main when issue 47 started
PACKAGE = "dim_before"  # the name the ref's package is imported under
TARGET_US = 30.0  # issue 47: the new host reads add at most this per host refresh
HOST_REFRESH_MS, INTERVAL_MS = 200, 50  # the defaults
READS, SAMPLES = 2000, 2000


def _modules(package: str) -> dict:
    names = ("lineprotocol", "schema", "sampling.collect", "sampling.sources.host", "sampling.view", "worker.registry")
    out = {n.rsplit(".", 1)[-1]: importlib.import_module(f"{package}.{n}") for n in names}
    try:
        out["disks"] = importlib.import_module(f"{package}.sampling.sources.disks")
    except ImportError:  # before issue 47
        out["disks"] = None
    return out


def _cpu_us(fn, pause: float) -> float:
    time.sleep(pause)
    t0 = time.thread_time_ns()
    fn()
    return (time.thread_time_ns() - t0) / 1000


def _paths() -> tuple:
    local = tempfile.gettempdir()
    return local, ("/dev/shm" if os.path.isdir("/dev/shm") else local)


def reads(before: dict, now: dict, n: int) -> dict:
    """Thread CPU (us) per host read, the three variants interleaved in rotating order."""
    paths = _paths()
    sources = {}
    for name, m in (("before", before), ("now", now)):
        fields = m["schema"].fields_for(m["schema"].TRACKING)
        sources[name] = m["host"].HostSource(frozenset(f for f in fields if f[0] == m["schema"].HOST))
    fields = now["schema"].fields_for(now["schema"].TRACKING)
    disks = now["disks"].DiskUsage(frozenset(f for f in fields if f[0] == now["schema"].DISK))
    host_now = sources["now"]
    calls = {
        "before": lambda: sources["before"].read("host"),
        "now": lambda: host_now.read("host"),
        "now+disks": lambda: (host_now.read("host"), disks.read(paths)),
    }
    out = {k: [] for k in calls}
    order = list(calls)
    for fn in calls.values():
        fn()  # files opened, CPU windows primed
    for i in range(n):
        for k in order[i % 3 :] + order[: i % 3]:
            out[k].append(_cpu_us(calls[k], 0.01))
    for s in sources.values():
        s.close()
    return {k: common.median(v) for k, v in out.items()} | {
        "host_fields": {k: len([f for f in s._plans["host"] for _ in f[1]]) for k, s in sources.items()}
    }


def _collector(m: dict):
    """The agent's collector for two worker views of this process (every metric of that version, no GPU)."""
    schema = m["schema"]
    fields = schema.fields_for(schema.TRACKING)
    views = []
    for i in range(2):
        registry = m["registry"].TaskRegistry(nthreads=2)
        registry.started(("task", i), job=1, dag=1 + i)
        info = {"address": f"tcp://10.0.0.1:{i}", "pid": os.getpid(), "tags": {"host": "node", "worker": f"w{i}"}}
        info["local_directory"] = _paths()[0]
        views.append(m["view"].WorkerView(str(i), info, m["registry"].CachedSnapshot(registry), fields, lambda: 0.0))
    refresh = m["host"].refresh_seconds(HOST_REFRESH_MS, INTERVAL_MS)
    host = m["host"].HostSource(frozenset(f for f in fields if f[0] == schema.HOST), refresh=refresh)
    if m["disks"] is None:
        return m["collect"].HostCollector(fields, None, host), views
    disk_fields = frozenset(f for f in fields if f[0] == schema.DISK)
    disks = m["disks"].DiskUsage(disk_fields, m["host"].refresh_seconds(1000, INTERVAL_MS))
    return m["collect"].HostCollector(fields, None, host, disks, paths=(_paths()[1],)), views


def samples(before: dict, now: dict, n: int) -> dict:
    """Thread CPU (us) per sample of the agent's collect + encode, before and now alternating; bytes per sample."""
    variants = {name: (m, *_collector(m)) for name, m in (("before", before), ("now", now))}
    out = {k: [] for k in variants}
    written = {k: 0 for k in variants}

    def sample(name):
        m, collector, views = variants[name]
        for v in views:
            v.snapshot.refresh()
        written[name] += sum(map(len, m["lineprotocol"].encode_many(collector.collect(views, time.time_ns()))))

    for name in variants:
        sample(name)
    written = {k: 0 for k in variants}
    for i in range(n):
        for name in ("before", "now") if i % 2 else ("now", "before"):
            out[name].append(_cpu_us(lambda name=name: sample(name), INTERVAL_MS / 4000))
    return {k: sum(v) / len(v) for k, v in out.items()} | {"bytes": {k: w / n for k, w in written.items()}}


def run(quick: bool) -> list[dict]:
    from dask_influx_metrics.sampling.sources.disks import REFRESH_S

    ref = os.environ.get("BENCH_BEFORE", BEFORE)
    n_reads, n_samples = (200, 200) if quick else (READS, SAMPLES)
    try:
        folder, package = common.package_at(ref, PACKAGE)
    except (subprocess.CalledProcessError, OSError) as e:  # no git history here (a shallow clone, an sdist)
        return [common.row(NAME, f"skipped: cannot take {ref} from git", None, "", notes=f"{type(e).__name__}: {e}")]
    sys.path.insert(0, folder)
    try:
        import dask_influx_metrics as current

        before, now = _modules(package), _modules(current.__name__)
        r = reads(before, now, n_reads)
        s = samples(before, now, n_samples)
    finally:
        sys.path.remove(folder)
        shutil.rmtree(folder, ignore_errors=True)
    every = 1000 * REFRESH_S / HOST_REFRESH_MS
    host_added, disks = r["now"] - r["before"], r["now+disks"] - r["now"]
    added = host_added + disks / every
    per_refresh = (s["now"] - s["before"]) * HOST_REFRESH_MS / INTERVAL_MS
    return [
        common.row(
            NAME,
            f"host reads per host refresh (default {HOST_REFRESH_MS} ms): every host field, and the filesystems "
            f"1 s apart, vs {ref}: CPU added, the mean per refresh",
            round(added, 1),
            "us",
            target=f"<= {TARGET_US:.0f} us",
            met=added <= TARGET_US,
            notes=f"host fields: median {r['now']:.1f} us now ({r['host_fields']['now']} fields) vs {r['before']:.1f} "
            f"us before ({r['host_fields']['before']}), {host_added:+.1f} us each refresh; the filesystems of "
            f"{' and '.join(_paths())} {disks:+.1f} us on the refresh that reads them (1 in {every:g}: "
            f"{host_added + disks:+.1f} us then); {n_reads} reads of each, 10 ms apart, interleaved in one process",
            details=r,
        ),
        common.row(
            NAME,
            f"the agent's collect + encode per sample: 2 worker views, every metric, {INTERVAL_MS} ms, host refresh "
            f"{HOST_REFRESH_MS} ms, filesystems 1 s",
            round(s["now"], 1),
            "us",
            baseline=round(s["before"], 1),
            notes=f"informational: {per_refresh:+.1f} us per host refresh ({HOST_REFRESH_MS // INTERVAL_MS} samples), "
            f"encoding included; line protocol {s['bytes']['now']:.0f} bytes per sample now vs "
            f"{s['bytes']['before']:.0f} before; {n_samples} samples of each, alternating, thread CPU means",
            details=s,
        ),
    ]


if __name__ == "__main__":
    common.standalone(NAME, run)
