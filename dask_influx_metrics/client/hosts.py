"""Host readings in per-worker views: the one ``host`` series of each host, read by host.

With ``sampler.host-once`` (the default) one worker per host writes the ``host``
measurement, tagged with the jobs and DAGs executing on every worker of the host
(``dag="0"`` when none runs a task). So the client reads host metrics by host,
never by worker:

- **Tables** (:meth:`~dask_influx_metrics.query.Store.worker_tables`, CSV, plots):
  each worker's rows get its host's reading taken at or before them (an as-of
  join, at most three host sampling intervals earlier: :func:`.tables.host_part`);
  the row keeps the worker's own ``job``/``dag``.
- **Peaks and summaries** of host metrics are the host's: computed from the host
  series with its union tags (per job: the samples at which the job had tasks
  executing on any worker of the host), then given to every worker of that host.
  Server-side (``MAX ... GROUP BY host, job``) and client-side (from
  :meth:`HostQuestions.host_tables`) agree by construction.
- **Older data** (every worker wrote its own host series, or ``host-once: false``)
  reads the same way: a worker's row takes its own reading of the same instant
  (the host series is all of the host's points), and a host's figures cover every
  worker's readings, each tagged with its own worker's jobs. Summaries weight each
  reading by the window before it, from the previous one of the host (:func:`.summary.weights`), so the
  interleaved readings of N writers share the host's time instead of each counting
  a whole interval.

A worker's host comes from its own points' ``host`` tag (:meth:`HostQuestions.hosts`).
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from .. import schema
from . import peaks as _peaks
from . import summary as _summary
from . import tables as _tables

DISK_COLUMNS = ["host", "worker", "job", "dag", "path", "used_percent", "used", "total"]


class HostQuestions:
    """The :class:`~dask_influx_metrics.query.Store` methods that read host metrics by host."""

    def hosts(self) -> dict[str, str]:
        """``{worker address: host}``, from the ``host`` tag of each worker's own points."""
        if getattr(self, "_hosts", None) is None:
            fields, workers, out = self.fields(), set(self.workers()), {}
            for m in (schema.WORKER, schema.GPU, schema.CUSTOM, schema.HOST):
                numeric = [
                    f
                    for f in fields.get(m, ())
                    if m == schema.CUSTOM or getattr(schema.FIELDS.get((m, f)), "type", str) is not str
                ]
                if not numeric or workers <= set(out):
                    continue
                rows = self.backend.max_by(m, numeric[0], ("host", "worker"))
                for w, h in zip(rows["worker"], rows["host"]):
                    if w in workers:
                        out.setdefault(w, h)
            self._hosts = out
        return dict(self._hosts)

    def gpus(self) -> pd.DataFrame:
        """The physical GPUs each worker used: ``host``, ``worker_index``, ``worker``, ``uuid`` and
        ``shared`` (another worker of the host used it too), from the per-worker GPU memory points
        (else the device points, which only a GPU's owner writes)."""
        index = {w: i for i, w in self.worker_map().items()}
        for field in ("worker_memory_used", "memory_used"):
            rows = self.backend.max_by(schema.GPU, field, ("host", "worker", "uuid"))
            if not rows.empty:
                break
        rows = rows[rows["worker"].isin(index)].drop(columns="max").drop_duplicates()
        users = rows.groupby(["host", "uuid"])["worker"].transform("nunique")
        rows = rows.assign(worker_index=rows["worker"].map(index), shared=users > 1)
        return rows.sort_values(["worker_index", "uuid"])[["host", "worker_index", "worker", "uuid", "shared"]]

    def gpu_ids(self) -> dict[str, dict[str, str]]:
        """``{worker: {index: "host/uuid"}}``: the physical GPU behind each device column of a worker's table
        (what counts a GPU several workers share once: :mod:`.summary`); ``worker/index`` where a point
        has no ``uuid`` (older data)."""
        if getattr(self, "_gpu_ids", None) is None:
            have = self.fields().get(schema.GPU, [])
            numeric = [f for f in have if getattr(schema.FIELDS.get((schema.GPU, f)), "type", str) is not str]
            field = next((f for f in ("utilization_gpu", "memory_used") if f in have), numeric[0] if numeric else None)
            rows = self.backend.max_by(schema.GPU, field, ("host", "worker", "index", "uuid")) if field else None
            out: dict = {}
            for host, worker, index, uuid in [] if rows is None else rows[["host", "worker", "index", "uuid"]].values:
                out.setdefault(worker, {})[str(index)] = f"{host}/{uuid}" if uuid else f"{worker}/{index}"
            self._gpu_ids = out
        return {w: dict(ids) for w, ids in self._gpu_ids.items()}

    def host_series(self, host: str, fields: list[str], job: Optional[int] = None) -> pd.DataFrame:
        """Every ``host`` point of ``host`` in range written by this Store's workers (long: ``time``, ``job``,
        ``dag``, ``worker``, fields); other points of that host (another tool's) are skipped with a note."""
        long = self.backend.frame(schema.HOST, list(dict.fromkeys(fields)), None, job, host=host)
        if long.empty or "worker" not in long.columns:
            return long
        ours = long["worker"].map(self.ours).astype(bool)
        if not ours.all():
            self.skip_note(
                f"skipped the host points of host {host!r} not written by this session's workers "
                f"(worker tags {sorted(str(w) for w in long.loc[~ours, 'worker'].unique())[:5]})"
            )
        return long[ours].reset_index(drop=True)

    def host_tables(self, metrics=None, job: Optional[int] = None, hosts=None) -> dict[str, pd.DataFrame]:
        """``{host: table}``: one table per host of its host metrics (default all present), like a
        worker's table but with the host points' own ``job``/``dag`` (every worker of the host);
        ``attrs["interval"]`` is the seconds a row stands for where no later row tells (1/N of an
        interval where N workers wrote the host at once: older data). ``job``: points whose ``job`` tag holds it only."""
        chosen = (
            [m for m in self.resolve_metrics(metrics) if m.measurement == schema.HOST]
            if metrics is not None
            else [m for m in _tables.default_metrics(self.fields()) if m.measurement == schema.HOST]
        )
        out = {}
        for host in sorted(set(self.hosts().values()) if hosts is None else set(hosts) - {None}):
            long = self.host_series(host, [m.field for m in chosen], job)
            table = _tables.build({schema.HOST: long}, chosen, self.origin_ns, worker=host)
            table.attrs.update(host=host, interval=_row_seconds(long))
            out[host] = table
        return out

    def host_tables_by_worker(self, workers, metrics, job: Optional[int] = None) -> dict[str, pd.DataFrame]:
        """``{worker: its host's table}`` (:meth:`host_tables`) for the worker addresses ``workers``."""
        where = self.hosts()
        tables = self.host_tables(metrics, job, hosts=[where.get(w) for w in workers])
        return {w: tables[where[w]] for w in workers if where.get(w) in tables}

    def host_longs(self, workers, fields: list[str]) -> dict[str, pd.DataFrame]:
        """``{worker: the host series of its host}`` for joining into worker tables (read once per host)."""
        where, empty = self.hosts(), pd.DataFrame(columns=["time", "job", "dag", "worker", *fields])
        series = {h: self.host_series(h, fields) for h in {where.get(w) for w in workers} - {None}}
        return {w: series.get(where.get(w), empty) for w in workers}

    def disk_points(self) -> pd.DataFrame:
        """Every ``disk`` point in range written by this Store's workers (one per filesystem and host reading):
        ``time`` and :data:`DISK_COLUMNS`."""
        if getattr(self, "_disk_points", None) is None:
            points = self.backend.points(schema.DISK, DISK_COLUMNS)
            if not points.empty:
                points = points[points["worker"].map(self.ours).astype(bool)].reset_index(drop=True)
            self._disk_points = points
        return self._disk_points

    def node_tables(self, workers) -> dict[str, pd.DataFrame] | None:
        """``{worker: its host's table}`` (:meth:`host_tables`) of what the summary's node rows read: the host
        metrics of :data:`.summary.HOST_METRICS` present and, column :data:`.summary.DISK_USAGE`, the fullest
        of the workers' filesystems at each host reading; None when the workers recorded no host metric."""
        names = [n for n in _summary.HOST_METRICS if n in self.metrics()]
        if not names:
            return None
        tables = self.host_tables_by_worker(workers, names)
        disks = self.disk_points()
        for table in {id(t): t for t in tables.values()}.values():
            mine = disks[disks["host"] == table.attrs["host"]] if not disks.empty else disks
            if not mine.empty and not table.empty:
                fullest = mine.groupby("time", as_index=False).agg(used_percent=("used_percent", "max"))
                usage = _tables.Metric(_summary.DISK_USAGE, schema.DISK, "used_percent", "%")
                times = table.index.as_unit("ns").asi8
                table[_summary.DISK_USAGE] = _tables.host_part(times, fullest, [usage], "")[usage.name].to_numpy()
        return tables

    def host_peaks(self, metric, per_job: bool, chosen, job, server: bool) -> pd.DataFrame:
        """Peaks of a host metric: per host (server- or client-side), then one row set per worker."""
        where = self.hosts()
        hosts = sorted({where.get(w) for _, w in chosen} - {None})
        if server:  # by writer too, to leave out another tool's points of the host
            by = ("host",) + (("job",) if per_job else ())
            groups = self.backend.max_by(schema.HOST, metric.field, by + ("worker",), None, job, busy=per_job)
            groups = groups[groups["host"].isin(hosts) & groups["worker"].map(self.ours).astype(bool)]
            groups = groups.groupby(list(by), as_index=False)["max"].max().rename(columns={"host": "worker"})
            tidy = _peaks.from_groups(groups, metric, {h: 0 for h in hosts}, per_job)
        else:
            tables = self.host_tables([metric.name], job, hosts=hosts)
            tidy = _peaks.from_tables(list(tables.values()), metric.name, per_job, metric.unit)
        workers = pd.DataFrame([(i, w, where.get(w)) for i, w in chosen], columns=["worker_index", "worker", "host"])
        rows = tidy.drop(columns=["worker_index"]).rename(columns={"worker": "host"}).merge(workers, on="host")
        return _peaks.tidy(rows.drop(columns=["host", "metric", "unit"]), metric.name, metric.unit)


def _row_seconds(long: pd.DataFrame) -> float:
    """Seconds one host point stands for: the writers' sampling interval, divided by the number of
    writers where several wrote the host at once (older data, or ``sampler.host-once: false``).
    Writers that took over from one another (the writer exited) wrote one after the other: 1."""
    step = _tables.host_step_ns(long)
    if not step:
        return 0.0
    writers = long.sort_values("time", kind="stable")["worker"].fillna("") if "worker" in long else pd.Series([""])
    changes = int((writers != writers.shift()).sum()) - 1
    together = writers.nunique() if changes > writers.nunique() - 1 else 1
    return step / 1e9 / together
