"""Per-job GPU accounting in the sampler: cumulative totals per (GPU, job), from each sample's readings.

:class:`Accounting` is fed by :class:`~.collect.HostCollector` (the agent's, or a worker's own in thread
mode) with the readings each sample carries: per GPU its device fields and, per worker using it, that
worker's own fields (``worker_gpu_share``, ``worker_memory_used``); per worker its executing tasks and
``cpu_percent``. The rules (docs/attribution.md, "Accounting"):

* **Window.** A GPU's reading at a sample stands for the time since its previous sample (at most
  :data:`CAP_STEPS` polling intervals; the first, one interval), as the summaries count it.
* **Whose.** Each worker using the GPU has a share of it: 1 where it is the only user and NVML lists no
  other process, else its ``worker_gpu_share`` (its process tree's share of the kernel time). A worker's
  share is split among its executing tasks, each task's part going to its job; a worker running no task,
  tasks of no job (job 0), or processes of no worker: the **idle** row. The window waits for the share
  that covers it (the next per-process answer) and, where GPM is read, for its GPM value.
* **Busy, SM-active, tensor-active seconds**: ``reading / 100 x window x fraction``.
* **Energy**: each window's ``power_draw x window`` (the provisional energy) is split by the same fractions;
  when the device's energy counter is read (every 10 s, and at a worker's or the session's last sample) the
  provisional energy since the previous read is scaled to the counter's delta, so jobs + idle = the
  counter's delta exactly. Where the GPU has no counter, the integrated power is the energy.
* **Memory**: the GPU memory the process trees of the workers running the job hold (a worker running two
  jobs counts for both): its peak, and memory x window (the time-average is that over ``gpu_seconds``).
* **CPU** (per host and job): a worker's ``cpu_percent / 100 x`` its window, split like its share.

Points (:data:`~dask_influx_metrics.schema.ACCOUNTING`) carry the totals so far: every ``interval`` for
every row of a job that ran within ``retention`` (and the idle rows), at once for a job that stopped running
on the host (at most once a second), and every row at a final sample and on :meth:`close` (sent
:data:`FINAL_REPEATS` times by the sender: the last point has no successor to carry it). A lost point costs
no total. A job's rows are dropped ``retention`` after it last ran; if it runs again, new rows (a new
``since``) start from 0.

>>> from dask_influx_metrics.link.snapshot import Snapshot
>>> acc = Accounting(interval_s=10, step_s=0.5, tags={"host": "h", "worker": "agent-h"}, since_ns=0)
>>> busy = Snapshot(((("k", 0), 7, 1),), 1, 0, 7)
>>> for k in range(3):  # one worker running job 7 alone on its GPU at 80 %, 300 W
...     _ = acc.update(k * 500_000_000, k * 500_000_000, [("GPU-1", {"utilization_gpu": 80.0, "power_draw": 300.0},
...                    {"index": "0"}, [("w", {})])], [("w", "tcp://w:1", busy, {"cpu_percent": 50.0})])
>>> row = acc.live()["jobs"]["7"]
>>> round(row["gpus"]["GPU-1"]["busy_seconds"], 3), round(row["gpus"]["GPU-1"]["energy_joules"]), row["cpu_seconds"]
(1.2, 450, 0.75)
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from .. import lineprotocol
from ..notices import Once
from ..schema import ACCOUNTING, ACCOUNTING_FIELDS, IDLE_JOB, Point

logger = logging.getLogger(__name__)

CAP_STEPS = 3  # a window is at most this many polling intervals (a stalled sampler charges no one its gap)
WAIT_S = 5.0  # a window waits at most this long for its share or GPM value, then is settled with what is known
JOB_END_EVERY_S = 1.0  # a job's rows are written at its end on the host at most this often
FINAL_REPEATS = 5  # the session's last point is sent this many times (separate sends: datagrams)
MIB = 2.0**20
IDLE = IDLE_JOB
_FIELDS = (
    ACCOUNTING_FIELDS  # a row's values, by index: 0 gpu, 1 busy, 2 sm, 3 tensor, 4 energy, 5 peak, 6 memory, 7 cpu
)
_WAIT = object()  # a window's share or GPM value not known yet


class Row:
    """One row's totals: a (GPU, job) pair, a GPU's idle row, or a job's CPU row (``uuid`` None)."""

    __slots__ = ("job", "uuid", "tags", "values", "changed")

    def __init__(self, job, uuid, tags: dict):
        self.job, self.uuid, self.tags = job, uuid, tags
        self.values: list = [None] * len(_FIELDS)
        self.changed = True  # since it was last written

    def add(self, i: int, value: float) -> None:
        self.values[i] = value if self.values[i] is None else self.values[i] + value
        self.changed = True

    def peak(self, value: float) -> None:
        old = self.values[5]
        if old is None or value > old:
            self.values[5] = value
            self.changed = True

    def fields(self) -> dict:
        return {name: float(v) for name, v in zip(_FIELDS, self.values) if v is not None}


class _Worker:
    """What the accounting keeps of one worker between samples."""

    __slots__ = ("snap", "parts", "last", "address")

    def __init__(self, address: str):
        self.snap, self.parts, self.last, self.address = None, {}, None, address


class _Window:
    """One sample's reading of one GPU, until its share (and GPM value) is known."""

    __slots__ = ("t", "dt", "util", "power", "gpm", "users", "memory", "share", "counter")

    def __init__(self, t, dt, util, power, users, memory, counter):
        self.t, self.dt, self.util, self.power = t, dt, util, power
        self.users, self.memory, self.counter = users, memory, counter
        self.gpm = None  # (sm_active, pipe_tensor_active) | None (not read) | _WAIT
        self.share = None  # {worker id: share 0-1} | _WAIT


class _Gpu:
    """What the accounting keeps of one GPU between samples."""

    __slots__ = tuple(
        "uuid last pending shared gpm_seen counter counting open open_sum power memory now device tags per_worker "
        "busy energy".split()
    )

    def __init__(self, uuid: str):
        self.uuid, self.last = uuid, None
        self.pending: collections.deque = collections.deque()
        self.shared = False  # several workers use it, or a share was read: windows wait for their share
        self.gpm_seen = False  # a GPM value came: windows wait for theirs
        self.counter = None  # the energy counter's last value (mJ)
        self.counting = False  # the counter was ever read: energy is trued up against it
        self.open: dict = {}  # job -> provisional energy since the last counter read
        self.open_sum = 0.0
        self.power = None  # the last power_draw read
        self.memory: dict = {}  # worker id -> the last worker_memory_used (MiB)
        self.now: dict = {}  # job -> (own utilization %, own sm_active % or None, memory bytes or None)
        self.device: dict = {}  # the latest device fields
        self.tags: dict = {}  # its device tags (index, uuid, nvml_index, name)
        self.per_worker: dict = {}  # worker address -> its latest own fields of this GPU
        self.busy = self.energy = None  # the device's totals (jobs + idle): never shrink when rows are dropped


class Accounting:
    """Per-job GPU totals of one sampler (see the module docstring).

    ``interval_s``: how often points are written (setting ``accounting.interval``); ``step_s``: the polling
    interval; ``tags``: the tags of every point (``host``, ``worker`` = the sender, the extra tags);
    ``retention_s``: how long a job's rows stay after it last ran (``accounting.retention``); ``write``:
    whether it makes points (False: only read through :meth:`rows`, :meth:`live`, e.g. for /metrics).
    """

    def __init__(
        self,
        interval_s: float,
        step_s: float,
        tags: dict,
        retention_s: float = 300.0,
        since_ns: int | None = None,
        clock=time.monotonic,
        report=None,
        write: bool = True,
    ):
        self.interval, self.step, self.retention = float(interval_s), float(step_s), float(retention_s)
        self.write = write  # False: kept for /metrics only (the tracking list lacks accounting)
        self.tags, self.since = dict(tags), time.time_ns() if since_ns is None else int(since_ns)
        self._clock, self._report = clock, report
        self._now_ns = self.since  # the current sample's time: a new row's since
        self._lock = threading.Lock()  # update() (the sampler) against live()/rows() (the /metrics thread)
        self._gpus: dict[str, _Gpu] = {}
        self._rows: dict[tuple, Row] = {}  # (uuid or None, job) -> row
        self._workers: dict[str, _Worker] = {}
        self._running: set = set()  # jobs with tasks on the host's workers at the last sample
        self._active: dict = {}  # job -> monotonic time it last ran here (its rows stay ``retention`` after)
        self._ended_at: dict = {}  # job -> monotonic time its rows were last written for its end
        self._next = None  # monotonic time of the next interval's points
        self._last_points: list[Point] = []  # the final write (sent again by close)
        self._stamp = 0
        self._once = Once()

    # --- feeding ----------------------------------------------------------------------------------
    def update(self, now_ns: int, stamp_ns: int, gpus: list, workers: list, final: bool = False) -> list[Point]:
        """One sample: ``gpus`` = ``[(uuid, device fields, device tags, [(worker id, its own fields), ...])]``,
        ``workers`` = ``[(worker id, address, snapshot, worker fields)]``; returns the points due now
        (timed ``stamp_ns``)."""
        with self._lock:
            self._stamp, self._now_ns = stamp_ns, now_ns
            now = self._clock()
            parts, running, known = {}, set(), self._workers
            self._workers = {}  # the workers of this sample (one that left is forgotten)
            for wid, address, snap, fields in workers:
                w = self._workers[wid] = known.get(wid) or _Worker(address)
                parts[wid] = w.parts if w.snap is snap else self._parts(w, snap)  # (the same while it is idle)
                running.update(parts[wid])
                self._cpu(w, fields.get("cpu_percent"), now_ns)
            for uuid, device, tags, users in gpus:
                self._gpu(uuid, device, tags, users, parts, now_ns, final)
            self._active.update(dict.fromkeys(running, now))
            ended, self._running = self._running - running, running
            return self._points(now, stamp_ns, final, ended)

    @staticmethod
    def _parts(w: _Worker, snap) -> dict:
        """``{job: part of the worker}``: its executing tasks' jobs, each task an equal part (job 0, a task of
        no job, is left out: its part is idle); kept with ``snap``, for as long as it is the worker's."""
        parts: dict = {}
        running = snap.running
        for _, job, _ in running:
            if job:
                parts[job] = parts.get(job, 0.0) + 1.0 / len(running)
        w.snap, w.parts = snap, parts
        return parts

    def _window(self, last_ns, now_ns) -> float:
        if last_ns is None:
            return self.step
        return min(max(0.0, (now_ns - last_ns) / 1e9), CAP_STEPS * self.step)

    def _cpu(self, w: _Worker, percent, now_ns) -> None:
        """The worker's CPU seconds since its previous sample, split like its share (the rest: idle)."""
        last, w.last = w.last, now_ns
        if percent is None:
            return
        seconds = percent / 100.0 * self._window(last, now_ns)
        rest = seconds
        for job, part in w.parts.items():
            self._row(None, job).add(7, seconds * part)
            rest -= seconds * part
        if rest > 1e-9 * seconds or not w.parts:
            self._row(None, IDLE).add(7, max(rest, 0.0))

    def _gpu(self, uuid, device, tags, users, parts, now_ns, final) -> None:
        g = self._gpus.get(uuid)
        if g is None:
            g = self._gpus[uuid] = _Gpu(uuid)
        g.device, g.tags = device, tags
        dt = self._window(g.last, now_ns)
        g.last = now_ns
        power = device.get("power_draw")
        if power is not None:
            g.power = power
        shares, mine, memory, held = None, [], {}, g.memory
        g.memory, g.per_worker = {}, {}  # its users now (one that left is forgotten)
        for wid, own in users:
            mine.append((wid, parts.get(wid, {})))
            share = own.get("worker_gpu_share")
            if share is not None:
                shares = shares or {}
                shares[wid] = share / 100.0
            mem = own.get("worker_memory_used", held.get(wid))  # not read this time: the last reading
            if mem is not None:
                g.memory[wid] = mem
            g.per_worker[self._workers[wid].address if wid in self._workers else wid] = own
        for wid, of_worker in mine:  # the memory of the workers running each job (a worker's for each of its jobs)
            held = g.memory.get(wid)
            for job in of_worker:
                so_far = memory.get(job, 0.0)
                memory[job] = None if held is None or so_far is None else so_far + held
        window = _Window(now_ns, dt, device.get("utilization_gpu"), g.power, mine, memory, None)
        window.counter = device.get("total_energy_consumption")
        g.shared = g.shared or len(users) > 1 or shares is not None
        if not g.shared:
            window.share = {wid: 1.0 for wid, _ in mine}
        else:
            window.share = _WAIT
            if shares is not None:  # an answer: it covers every window still waiting, this one too
                for w in (*g.pending, window):
                    if w.share is _WAIT:
                        w.share = {wid: shares.get(wid, 0.0) for wid, _ in w.users}
        sm, tensor = device.get("sm_active"), device.get("pipe_tensor_active")
        if sm is not None or tensor is not None:
            g.gpm_seen = True
            for w in (*g.pending, window):
                if w.gpm is _WAIT or w.gpm is None:
                    w.gpm = (sm, tensor)
        elif g.gpm_seen:
            window.gpm = _WAIT
        g.pending.append(window)
        self._settle(g, now_ns, final)

    def _settle(self, g: _Gpu, now_ns: int, final: bool) -> None:
        """Commit the waiting windows in order, as far as their share and GPM value are known (all of them on a
        final sample; a window waiting longer than :data:`WAIT_S` with what is known)."""
        pending = g.pending
        while pending:
            w = pending[0]
            if w.share is _WAIT or w.gpm is _WAIT:
                if not final and now_ns - w.t < WAIT_S * 1e9:
                    return
                if w.share is _WAIT:
                    self._say(
                        ("no-share", g.uuid),
                        f"GPU {g.uuid} is shared, but no per-process share came for {WAIT_S:g} s: its busy time and "
                        "energy of those windows go to the idle row (said once)",
                    )
                    w.share = {}
                if w.gpm is _WAIT:
                    w.gpm = None
            pending.popleft()
            self._commit(g, w)

    def _commit(self, g: _Gpu, w: _Window) -> None:
        parts: dict = {}
        for wid, of_worker in w.users:
            s = w.share.get(wid, 0.0)
            for job, part in of_worker.items():
                parts[job] = parts.get(job, 0.0) + s * part
        idle = max(0.0, 1.0 - sum(parts.values()))
        sm, tensor = w.gpm if w.gpm is not None else (None, None)
        readings = ((1, w.util), (2, sm), (3, tensor))
        jobs = {job for _, of_worker in w.users for job in of_worker}
        now: dict = {}
        for job in jobs:
            row, part = self._row(g.uuid, job), parts.get(job, 0.0)
            row.add(0, w.dt)
            for i, value in readings:
                if value is not None:
                    row.add(i, value / 100.0 * w.dt * part)
            held = w.memory.get(job)
            if held is not None:
                row.peak(held * MIB)
                row.add(6, held * MIB * w.dt)
            now[job] = (
                None if w.util is None else w.util * part,
                None if sm is None else sm * part,
                None if held is None else held * MIB,
            )
        g.now = now
        if w.util is not None:
            g.busy = (g.busy or 0.0) + w.util / 100.0 * w.dt
        idle_row = self._row(g.uuid, IDLE)
        if not jobs:
            idle_row.add(0, w.dt)
        for i, value in readings:
            if value is not None:
                idle_row.add(i, value / 100.0 * w.dt * idle)
        self._energy(g, w, parts, idle)

    def _energy(self, g: _Gpu, w: _Window, parts: dict, idle: float) -> None:
        """Provisional energy (power x window) by the window's parts; trued up to the counter when it is read."""
        energy = (w.power if w.power is not None else 1.0) * w.dt  # no power read: split by time
        if w.counter is not None:
            g.counting = True
        if not g.counting:
            if w.power is not None:  # no counter on this GPU: integrated power
                for job, part in parts.items():
                    self._row(g.uuid, job).add(4, energy * part)
                self._row(g.uuid, IDLE).add(4, energy * idle)
                g.energy = (g.energy or 0.0) + energy
            return
        for job, part in parts.items():
            g.open[job] = g.open.get(job, 0.0) + energy * part
        g.open[IDLE] = g.open.get(IDLE, 0.0) + energy * idle
        g.open_sum += energy
        if w.counter is None:
            return
        if g.counter is not None and w.counter < g.counter:
            self._say(("counter", g.uuid), f"GPU {g.uuid}: the energy counter went back; energy re-based there")
        elif g.counter is not None:
            delta = (w.counter - g.counter) / 1000.0  # mJ -> J
            if g.open_sum > 0:
                scale = delta / g.open_sum
                for job, provisional in g.open.items():
                    self._row(g.uuid, job).add(4, provisional * scale)
            elif delta > 0:
                self._row(g.uuid, IDLE).add(4, delta)
            g.energy = (g.energy or 0.0) + delta
        g.counter, g.open, g.open_sum = w.counter, {}, 0.0

    def _row(self, uuid, job) -> Row:
        row = self._rows.get((uuid, job))
        if row is None:  # since: when its counting began (a job's rows made again later start from 0)
            tags = {**self.tags, "job": str(job), **({"uuid": uuid} if uuid is not None else {})}
            row = self._rows[uuid, job] = Row(job, uuid, {**tags, "since": str(self._now_ns)})
        return row

    def _say(self, key, message: str) -> None:
        if not self._once(key):
            return
        if self._report is not None:
            self._report("accounting", message, key=key)
        else:
            logger.warning("influx-metrics accounting: %s", message)

    # --- points -----------------------------------------------------------------------------------
    def _points(self, now: float, stamp_ns: int, final: bool, ended: set) -> list[Point]:
        tick = final or self._next is None or now >= self._next
        due = []
        if tick:
            self._next = now + self.interval if self._next is None else max(self._next + self.interval, now)
            due = list(self._rows.values())
            gone = {j for j, t in self._active.items() if now - t > self.retention and j not in self._running}
            if gone:  # written at every interval meanwhile (and now); if such a job runs again: new rows
                self._rows = {k: r for k, r in self._rows.items() if r.job not in gone}
                for job in gone:
                    del self._active[job]
                    self._ended_at.pop(job, None)
        elif ended:
            done = {j for j in ended if now - self._ended_at.get(j, -JOB_END_EVERY_S) >= JOB_END_EVERY_S}
            for job in done:
                self._ended_at[job] = now
            due = [r for r in self._rows.values() if r.job in done]
        points = []
        for row in due if self.write else ():
            fields = row.fields()
            if fields:
                points.append(Point(ACCOUNTING, row.tags, fields, stamp_ns))
                row.changed = False
        if final:
            self._last_points = points
        return points

    def close(self, now_ns: int | None = None) -> list[Point]:
        """The session's last points: every row, with every waiting window settled with what is known. Its
        sender sends them :data:`FINAL_REPEATS` times (:func:`repeat`)."""
        with self._lock:
            now_ns = time.time_ns() if now_ns is None else now_ns
            for g in self._gpus.values():
                self._settle(g, now_ns, final=True)
            if self._last_points and not any(r.changed for r in self._rows.values()):
                return list(self._last_points)
            stamp = max(self._stamp, now_ns)
            rows = self._rows.values() if self.write else ()
            return [Point(ACCOUNTING, r.tags, r.fields(), stamp) for r in rows if r.fields()]

    # --- reading ----------------------------------------------------------------------------------
    def rows(self) -> list[tuple]:
        """``[(job tag, uuid or None, (values in schema order, None where never known))]`` of every row now."""
        with self._lock:
            return [(str(r.job), r.uuid, tuple(r.values)) for r in self._rows.values()]

    def gauges(self) -> dict:
        """The latest readings of each GPU: ``{uuid: (device tags, device fields, {worker address: its own
        fields}, {"busy_seconds": total, "energy_joules": total})}`` (the device's totals: jobs + idle)."""
        with self._lock:  # a GPU no worker used at the last sample: its totals only, no stale reading
            return {
                u: (
                    g.tags,
                    g.device if g.last == self._now_ns else {},
                    dict(g.per_worker) if g.last == self._now_ns else {},
                    {"busy_seconds": g.busy, "energy_joules": g.energy},
                )
                for u, g in self._gpus.items()
            }

    def live(self) -> dict:
        """The totals so far and the latest per-job figures, as plain JSON-able data (for a live view, e.g.
        the agent's beat): ``{"time", "since", "jobs": {job: {"gpus": {uuid: {field: total}}, "cpu_seconds",
        "now": {uuid: {"utilization_gpu", "sm_active", "memory_bytes"}}}}, "idle": {...same...},
        "gpus": {uuid: {"utilization_gpu", "sm_active", "memory_used", "power_draw"}}}``: "now" is the job's
        own share of the latest settled reading (% of the GPU), device figures as read."""
        with self._lock:
            jobs: dict = {}
            for r in self._rows.values():
                entry = jobs.setdefault(str(r.job), {"gpus": {}, "cpu_seconds": None, "now": {}})
                if r.uuid is None:
                    entry["cpu_seconds"] = r.values[7]
                else:
                    entry["gpus"][r.uuid] = r.fields()
            for uuid, g in self._gpus.items():
                for job, (util, sm, held) in g.now.items():
                    entry = jobs.setdefault(str(job), {"gpus": {}, "cpu_seconds": None, "now": {}})
                    entry["now"][uuid] = {"utilization_gpu": util, "sm_active": sm, "memory_bytes": held}
            gpus = {
                u: {k: g.device.get(k) for k in ("utilization_gpu", "sm_active", "memory_used", "power_draw")}
                for u, g in self._gpus.items()
            }
            idle = jobs.pop(IDLE, {"gpus": {}, "cpu_seconds": None, "now": {}})
            return {"time": self._stamp, "since": self.since, "jobs": jobs, "idle": idle, "gpus": gpus}


def repeat(points: list[Point], send, field_tags=()) -> None:
    """Send the session's last accounting ``points`` :data:`FINAL_REPEATS` times, each its own ``send`` (its own
    datagram on UDP: identical points, InfluxDB keeps one), since no later point carries its totals.
    ``field_tags``: the tags written as fields (the sampler's, e.g. ``session`` with ``session-tag: false``)."""
    lines = lineprotocol.encode_many([lineprotocol.tags_as_fields(p, field_tags) for p in points])
    for _ in range(FINAL_REPEATS if lines else 0):
        send(lines)


def from_settings(settings, tags: dict, report=None, serve: bool = False) -> Accounting | None:
    """The sampler's :class:`Accounting` when the tracking list has ``accounting`` (or, with ``serve``, when
    ``prometheus.port`` is set: kept for /metrics, no points), else None."""
    write = any(m == ACCOUNTING for m, _ in settings.fields)
    if not write and not (serve and settings.prometheus_port is not None):
        return None
    return Accounting(
        settings.accounting_interval,
        settings.polling_interval / 1000.0,
        {**settings.tags, **tags},
        retention_s=settings.accounting_retention,
        report=report,
        write=write,
    )
