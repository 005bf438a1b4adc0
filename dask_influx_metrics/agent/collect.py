"""One sample of a host: each GPU once, the host once, each worker process; who gets which reading.

The rules (README "What a number means"):

* A GPU's **device-wide** reading describes the whole device, whoever uses it.
  It is read once per sample and written once, under the ``worker`` tag of the
  first of the workers that use it (its *owner*: not significant), tagged with
  the **union** of the jobs and DAGs executing on all of them: ``dag="0"`` only
  when none of them runs a task (then the owner's last job).
* The ``host`` reading likewise: once, union over every worker of the host.
  Only where the workers have no rows of their own (no ``gpu`` or ``worker``
  field tracked, or no GPU found) does each worker get its own copy (tagged
  with its own jobs).
* **Per-worker** readings (the worker process's CPU and RSS, its tasks, the GPU
  memory its process tree holds and, on a GPU several workers use, its share of
  the GPU's time) carry that worker's own tags. When the owner's
  own tags equal the union, its per-worker GPU fields join the device point.
* Every point of a worker is timed on the scheduler's clock through that
  worker's steadied offset (so a worker's points of one sample share their
  time: its table's row), device-wide points through their owner's; host
  points through the median of the workers' offsets (one clock for the host,
  so a change of owner never reorders its series; tables join it as of time).

Example
-------
>>> from dask_influx_metrics.snapshot import Activity
>>> class W:
...     def __init__(self, i, running):
...         self.id, self.tags, self.uuids = str(i), {"host": "h", "worker": f"w{i}"}, ["GPU-1"]
...         self.activity = lambda: Activity(running, 1, 0, 1)
...         self.offset = lambda: 0.0
...     def read(self):
...         return {}
>>> class Gpus:
...     def start_sample(self): pass
...     def read(self, uuid): return {"utilization_gpu": 50.0}
...     def read_worker(self, uuid, pids, shared): return {}
...     def tags(self, uuid, index): return {"index": str(index), "uuid": uuid}
>>> c = HostCollector(frozenset({("gpu", "utilization_gpu")}), Gpus(), host=None)
>>> [p] = c.collect([W(1, ((("a", 0), 2, 7),)), W(2, ((("b", 0), 3, 8),))], now_ns=0)
>>> p.tags["worker"], p.tags["job"], p.tags["dag"]
('w1', '2,3', '7,8')
"""

from __future__ import annotations

from .. import jobtags
from ..schema import GPU, HOST, WORKER, Point


def union_tags(workers) -> tuple[str, str]:
    """``(job, dag)``: the jobs and DAGs executing on any of ``workers`` (the first's last job if none)."""
    snaps = [w.activity() for w in workers]
    jobs = {j for s in snaps for _, j, _ in s.running}
    dags = {d for s in snaps for _, _, d in s.running}
    return jobtags.format(jobs, idle=snaps[0].last_job), jobtags.format(dags)


class HostCollector:
    """Builds one sample's points from the workers of a host (see the module docstring).

    ``gpus``: the host's GPUs (:class:`.gpus.NvmlDevices` or :class:`.gpus.SimulatedDevices`), or
    None. ``host``: the :class:`.sources.host.HostSource` of the ``host`` fields, or None. Each worker
    (:class:`.workers.WorkerView`) has ``id``, ``tags``, ``uuids``, ``activity()``, ``offset()``,
    ``read()`` (its ``worker`` fields) and ``pids()`` (its process tree).
    """

    def __init__(self, fields: frozenset, gpus, host):
        self.gpus, self.host = gpus, host
        self._gpu_fields = any(m == GPU for m, _ in fields)
        self._host_each = not any(m in (GPU, WORKER) for m, _ in fields)  # a worker has no other rows
        self._per_worker_gpu = any(m == GPU and f.startswith("worker_") for m, f in fields)
        self.shared: dict[str, list] = {}  # uuid -> the workers using it now, when more than one

    def collect(self, workers: list, now_ns: int) -> list[Point]:
        if not workers:
            return []
        points = []
        own, times = {}, {}
        for w in workers:
            snap = w.activity()
            own[w.id] = {**w.tags, "job": snap.job_tag, "dag": snap.dag_tag}
            times[w.id] = now_ns + int(w.offset() * 1e9)
            fields = w.read()
            if fields:
                points.append(Point(WORKER, own[w.id], fields, times[w.id]))
        shared_ns = sorted(times.values())[len(workers) // 2]  # the host's points: the median offset
        if self.gpus is not None and self._gpu_fields:
            points += self._gpu_points(workers, own, times)
        if self.host is not None:
            fields = self.host.read(HOST)
            if fields and (self._host_each or not points):  # no worker has rows of its own (no GPU found)
                points += [Point(HOST, own[w.id], dict(fields), times[w.id]) for w in workers]
            elif fields:
                owner = workers[0]
                job, dag = union_tags(workers)
                points.append(Point(HOST, {**owner.tags, "job": job, "dag": dag}, fields, shared_ns))
        return points

    def _gpu_points(self, workers, own, times) -> list[Point]:
        users: dict[str, list] = {}
        for w in workers:
            for index, uuid in enumerate(w.uuids):
                users.setdefault(uuid, []).append((w, index))
        self.shared = {u: [w for w, _ in ws] for u, ws in users.items() if len(ws) > 1}
        self.gpus.start_sample()
        points = []
        for uuid, ws in users.items():
            (owner, index), device = ws[0], self.gpus.read(uuid)
            job, dag = union_tags([w for w, _ in ws]) if len(ws) > 1 else (own[owner.id]["job"], own[owner.id]["dag"])
            for w, i in ws:
                mine = self.gpus.read_worker(uuid, w.pids(), len(ws) > 1) if self._per_worker_gpu else {}
                tags = {**own[w.id], **self.gpus.tags(uuid, i)}
                if w is owner and (job, dag) == (tags["job"], tags["dag"]):
                    mine = {**device, **mine}  # nobody else runs a task on it now: one point
                elif w is owner and device:
                    points.append(Point(GPU, {**tags, "job": job, "dag": dag}, device, times[w.id]))
                if mine:
                    points.append(Point(GPU, tags, mine, times[w.id]))
        return points
