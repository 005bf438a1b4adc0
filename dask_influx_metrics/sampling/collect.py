"""One sample of a host: each GPU once, the host once, each worker process; who gets which reading.

The rules (README "What a number means"):

* A GPU's **device-wide** reading describes the whole device, whoever uses it.
  It is read once per sample and written on **each** worker using the GPU, with
  that worker's own per-worker GPU fields and that worker's **own** jobs and
  DAGs: every worker's table holds every GPU it uses, and a job's figures come
  from the samples at which it ran on a worker using that GPU. Readers that
  count devices (GPU-hours, idle GPU-hours) count each ``uuid`` once.
* The ``host`` reading is written once, under the first worker's name, tagged
  with the **union** of the jobs and DAGs executing on every worker of the host
  (``dag="0"`` only when none runs a task; then the first worker's last job).
  Only where the workers have no rows of their own (no ``gpu`` or ``worker``
  field tracked, or no GPU found) does each worker get its own copy (tagged
  with its own jobs).
* The ``disk`` readings (space in use on the filesystems the workers write to: each worker's
  ``local_directory`` and the collector's own ``paths``, each filesystem once) are written when
  they are read (once a second), once, with the ``host`` point's time and tags and a ``path`` tag.
* **Per-worker** readings (the worker process's CPU and RSS, its tasks, the GPU
  memory its process tree holds and, on a GPU several workers use, its share of
  the GPU's kernel time) carry that worker's own tags.
* **Accounting** (tracking name ``accounting``): each sample's readings also feed the per-job totals of
  :class:`.accounting.Accounting` (``accounting``), whose points come with the sample's when due.
* Every point of a worker is timed on the scheduler's clock through that
  worker's steadied offset (so a worker's points of one sample share their
  time: its table's row); host points through the median of the workers'
  offsets (one clock for the host, so a change of writer never reorders its
  series; tables join it as of time).

Example
-------
>>> from dask_influx_metrics.link.snapshot import Snapshot
>>> class W:
...     def __init__(self, i, running):
...         self.id, self.pid, self.tags, self.uuids = str(i), i, {"host": "h", "worker": f"w{i}"}, ["GPU-1"]
...         self.snapshot = lambda: Snapshot(running, 1, 0, 1)
...         self.offset = lambda: 0.0
...     def read(self, snap=None):
...         return {}
>>> class Gpus:
...     def start_sample(self, final): pass
...     def read(self, uuid): return {"utilization_gpu": 50.0}
...     def read_worker(self, uuid, pid, shared): return {}
...     def tags(self, uuid, index): return {"index": str(index), "uuid": uuid}
>>> c = HostCollector(frozenset({("gpu", "utilization_gpu")}), Gpus(), host=None)
>>> [(p.tags["worker"], p.tags["job"], p.tags["dag"], p.fields) for p in c.collect(
...     [W(1, ((("a", 0), 2, 7),)), W(2, ((("b", 0), 3, 8),))], now_ns=0)]
[('w1', '2', '7', {'utilization_gpu': 50.0}), ('w2', '3', '8', {'utilization_gpu': 50.0})]
"""

from __future__ import annotations

from .. import jobtags
from ..schema import DISK, GPU, HOST, WORKER, Point


def union_tags(workers) -> tuple[str, str]:
    """``(job, dag)``: the jobs and DAGs executing on any of ``workers`` (the first's last job if none)."""
    snaps = [w.snapshot() for w in workers]
    jobs = {j for s in snaps for _, j, _ in s.running}
    dags = {d for s in snaps for _, _, d in s.running}
    return jobtags.format(jobs, idle=snaps[0].last_job), jobtags.format(dags)


class HostCollector:
    """Builds one sample's points from the workers of a host (see the module docstring).

    ``gpus``: the host's GPUs (:class:`.gpus.NvmlDevices` or :class:`.gpus.SimulatedDevices`), or
    None. ``host``: the :class:`.sources.host.HostSource` of the ``host`` fields, or None. Each worker
    (:class:`.workers.WorkerView`) has ``id``, ``pid``, ``tags``, ``uuids``, ``snapshot()``,
    ``offset()`` and ``read(snapshot)`` (its ``worker`` fields). ``collect(..., final=True)``: the last sample
    of some of the workers (they leave): the GPUs' counters are read now, whenever they were last.
    ``disks``: the :class:`.sources.disks.DiskUsage` of the ``disk`` fields, or None; it reads the
    filesystems of ``paths`` and of each worker's ``local_directory``.
    ``accounting``: the per-job totals (:class:`.accounting.Accounting`) these samples feed, or None.
    """

    def __init__(self, fields: frozenset, gpus, host, disks=None, paths=(), accounting=None):
        self.gpus, self.host, self.disks, self.paths = gpus, host, disks, tuple(paths)
        self.accounting = accounting
        self._gpu_fields = any(m == GPU for m, _ in fields)
        self._host_each = not any(m in (GPU, WORKER) for m, _ in fields)  # a worker has no other rows
        self._per_worker_gpu = any(m == GPU and f.startswith("worker_") for m, f in fields)
        self.shared: dict[str, list] = {}  # uuid -> the workers using it now, when more than one
        # Tags change only with a worker's snapshot (the same object while it is idle): made once per snapshot.
        self._tags: dict = {}  # worker id -> (its snapshot, its tags, {(uuid, index): its gpu points' tags})
        self._union: tuple = ((), None)  # (the snapshots, the host point's job and dag)
        self._devices: dict = {}  # uuid -> its device tags (accounting)

    def collect(self, workers: list, now_ns: int, final: bool = False) -> list[Point]:
        if not workers:
            return []
        points = []
        own, times, snaps = {}, {}, []  # worker id -> (its snapshot, tags, its GPU points' tags); its time
        feed = [] if self.accounting is not None else None  # (worker id, address, snapshot, its fields)
        for w in workers:
            snap, mine = w.snapshot(), self._tags.get(w.id)
            if mine is None or mine[0] is not snap:  # a new snapshot: new tags
                mine = self._tags[w.id] = (snap, {**w.tags, "job": snap.job_tag, "dag": snap.dag_tag}, {})
            own[w.id] = mine
            snaps.append(snap)
            times[w.id] = t = now_ns + int(w.offset() * 1e9)
            fields = w.read(snap)
            if fields:
                points.append(Point(WORKER, mine[1], fields, t))
            if feed is not None:
                feed.append((w.id, w.tags["worker"], snap, fields))
        if len(self._tags) > len(workers):  # some left
            self._tags = {w.id: own[w.id] for w in workers}
        shared_ns = sorted(times.values())[len(workers) // 2]  # the host's points: the median offset
        devices = [] if feed is not None else None  # (uuid, device fields, device tags, [(worker id, own)])
        if self.gpus is not None and self._gpu_fields:
            points += self._gpu_points(workers, own, times, final, devices)
        if self.host is not None:
            fields = self.host.read(HOST)
            if fields and (self._host_each or not points):  # no worker has rows of its own (no GPU found)
                points += [Point(HOST, own[w.id][1], dict(fields), times[w.id]) for w in workers]
            elif fields:
                points.append(Point(HOST, self._union_tags(workers, tuple(snaps)), fields, shared_ns))
        if self.disks is not None and self.disks.due():
            points += self._disk_points(workers, tuple(snaps), shared_ns)
        if feed is not None:
            points += self.accounting.update(now_ns, shared_ns, devices, feed, final)
        return points

    def _union_tags(self, workers, snaps: tuple) -> dict:
        """The host point's tags: the first worker's, with the jobs and DAGs of every worker (made again only when
        ``snaps``, their snapshots of this sample, change)."""
        if snaps != self._union[0]:  # (the same snapshots: compared by identity first, at C speed)
            self._union = (snaps, {**workers[0].tags, **dict(zip(("job", "dag"), union_tags(workers)))})
        return self._union[1]

    def _disk_points(self, workers, snaps: tuple, shared_ns: int) -> list[Point]:
        """One ``disk`` point per filesystem of ``paths`` and the workers' ``local_directory``, with the host
        point's tags and time, when the filesystems are read (once a second: ``disks.due()``)."""
        union = self._union_tags(workers, snaps)
        paths = self.paths + tuple(getattr(w, "local_directory", None) for w in workers)
        return [Point(DISK, {**union, **r.tags}, r.fields, shared_ns) for r in self.disks.read(paths)]

    def _gpu_points(self, workers, own, times, final, devices=None) -> list[Point]:
        users: dict[str, list] = {}
        for w in workers:
            for index, uuid in enumerate(w.uuids):
                users.setdefault(uuid, []).append((w, index))
        self.shared = {u: [w for w, _ in ws] for u, ws in users.items() if len(ws) > 1}
        self.gpus.start_sample(final)
        points = []
        for uuid, ws in users.items():
            device = self.gpus.read(uuid)
            readers = [] if devices is not None else None
            for w, i in ws:
                mine = self.gpus.read_worker(uuid, w.pid, len(ws) > 1) if self._per_worker_gpu else {}
                if readers is not None:
                    readers.append((w.id, mine))
                if device or mine:
                    _, tags, by_device = own[w.id]
                    gpu_tags = by_device.get((uuid, i)) or by_device.setdefault(
                        (uuid, i), {**tags, **self.gpus.tags(uuid, i)}
                    )
                    points.append(Point(GPU, gpu_tags, {**device, **mine}, times[w.id]))
            if readers is not None:
                devices.append((uuid, device, self._device_tags(uuid, ws[0][1]), readers))
        return points

    def _device_tags(self, uuid: str, index: int) -> dict:
        tags = self._devices.get(uuid)
        if tags is None:
            tags = self._devices[uuid] = self.gpus.tags(uuid, index)
        return tags
