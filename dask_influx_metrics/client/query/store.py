"""The Store: one set of collected samples, whichever backend holds them (see
:mod:`dask_influx_metrics.client.query`), read as frames and points.

Data access only: what exists (workers, jobs, DAGs, fields, hosts, GPUs), the long samples of a
measurement, and why something is missing. The analyses take a Store as their first argument and
import it, never the reverse: tables (:mod:`dask_influx_metrics.client.tables`), peaks, summaries,
accounting, tasks, host tables, CSV and the report."""

from __future__ import annotations

import re
from typing import Optional

import pandas as pd

from ... import jobtags, schema
from . import metricnames as _names
from . import sessions as _sessions
from .base import Backend, QueryError, kept_lines, pending_notes

_DASK_ADDRESS = re.compile(r"^[A-Za-z][\w+.-]*://")  # a worker tag Dask wrote (scheme://...)


def _failed(name: str, failure: dict) -> str:
    """A custom metric that failed on the workers, in the worker's words (``custom metric 'x' failed: ...``)."""
    return f"{failure.get('message') or f'custom metric {name!r} failed'} (first report, on {failure.get('worker')})"


def _iso(ns: int) -> str:
    """Epoch ns as an ISO time in UTC.

    >>> _iso(1_500_000_000)
    '1970-01-01T00:00:01.500000Z'
    """
    return pd.Timestamp(int(ns), unit="ns", tz="UTC").isoformat().replace("+00:00", "Z")


DAG_POINT_COLUMNS = ("time", "job", "dag", "status", "event", "tasks", "label", "duration", "session")
# why GPU samples are missing, said wherever a reader finds none
NO_GPU = (
    "the workers reported no GPU (NVML missing, no device visible, CUDA_VISIBLE_DEVICES empty, or "
    "gpu.source none; each worker's log says which)"
)


DISK_COLUMNS = ["host", "worker", "job", "dag", "path", "used_percent", "used", "total"]


# The analyses that take a Store (dask_influx_metrics.query): until issue 46 they were its methods.
ANALYSES = frozenset(
    {"accounting", "to_csv", "host_tables", "peaks", "get_peaks", "report", "summary", "worker_tables"}
    | {"task_stream", "tasks", "activity", "gpu_during_tasks", "gpu_per_prefix"}
)


class Store:
    """One set of collected samples, read as frames (see the module docstring).

    A context manager: leaving ``with`` closes the backend's connections.

    >>> with connect("/tmp/dask-influx-metrics-1000") as db:  # doctest: +SKIP
    ...     jobs = db.jobs()
    """

    #: workers fetched at once by :func:`~dask_influx_metrics.client.tables.worker_tables`
    parallel = 4

    def __getattr__(self, name: str):
        """``db.summary()`` and the other analyses were Store methods: say where they are now."""
        if name in ANALYSES:
            raise AttributeError(
                f"Store.{name}() is now a function that takes the Store: "
                f"from dask_influx_metrics import query; query.{name}(db, ...)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __init__(
        self, backend: Backend, origin_ns: Optional[int] = None, workers=None, undelivered=None, session_note=""
    ):
        self.backend = backend
        #: which session was read, among which (``connect``'s :func:`.sessions.select`); "" when it is the only one
        self.session_note = session_note
        self.undelivered = undelivered  # a spool folder whose undelivered/ and refused/ samples are not in InfluxDB
        self._origin_ns = origin_ns
        self._own = None if workers is None else set(workers)  # the session's workers, when known
        self._skipped: list[str] = []  # notes on series skipped as not this session's
        self._workers: Optional[list[str]] = None
        self._fields: Optional[dict] = None
        self._hosts: Optional[dict] = None
        self._gpu_ids: Optional[dict] = None
        self._disk_points: Optional[pd.DataFrame] = None
        self.closed = False
        #: ``{custom metric: {"worker", "message"}}``: its first failure on the workers (``Monitor.query()``)
        self.failed_metrics: dict[str, dict] = {}

    def __repr__(self) -> str:
        return f"<Store {self.backend.language} {self.backend.describe()}>"

    @property
    def notes(self) -> list[str]:
        """One line per thing to read the answers with: corrupt spool lines skipped (file:line), samples taken
        from (or kept in) ``undelivered/`` or ``refused/``, series skipped, custom metrics that failed on the workers."""
        return (
            ([self.session_note] if self.session_note else [])
            + list(self.backend.notes)
            + self._skipped
            + [_failed(name, f) for name, f in sorted(self.failed_metrics.items())]
        )

    def ours(self, worker) -> bool:
        """Whether ``worker`` (a ``worker`` tag) is one whose series this Store reads (see :func:`connect`)."""
        return worker in self._own if self._own is not None else bool(_DASK_ADDRESS.match(str(worker)))

    def skip_note(self, note: str) -> None:
        self._skipped += [] if note in self._skipped else [note]

    def kept(self, measurement: str, field: str) -> str:
        """Where the samples of ``measurement``/``field`` missing from the source are, when InfluxDB refused
        them or they were not delivered (the ``undelivered`` folder of :func:`connect`); "" otherwise."""
        return "; ".join(kept_lines(self.undelivered, measurement, field)) if self.undelivered is not None else ""

    def kept_gpu(self, metrics=None) -> str:
        """:meth:`kept` of the gpu fields of ``metrics`` (names; default ``compute-util`` and ``total-mem``)."""
        names = ["compute-util", "total-mem"] if metrics is None else [metrics] if isinstance(metrics, str) else metrics
        known = _names.resolve([n for n in names if not _names.unknown([n])])
        found = (self.kept(m.measurement, m.field) for m in known if m.measurement == schema.GPU)
        return "; ".join(k for k in dict.fromkeys(found) if k)

    def scope(self) -> str:
        """Where this Store looks, in words: the source, the session, the time range and the tags."""
        b = self.backend
        when = ", ".join(
            f"{word} {_iso(ns)}" for word, ns in (("from", b.start_ns), ("to", b.stop_ns)) if ns is not None
        )
        tags = {k: v for k, v in sorted(b.tags.items()) if k != _sessions.SESSION}
        session = b.session is not None and b.language != "spool"  # a spool names its session's folder
        return (
            f"in {b.describe()}"
            + (f", session {_sessions.name(b.session)!r}" if session else "")
            + (f" {when}" if when else ", at any time")
            + (f", tags {tags}" if tags else "")
        )

    def sessions(self) -> pd.DataFrame:
        """Every session the source holds within the time range and tags (whichever this Store reads), newest
        first: ``index`` (1 = the latest; what ``connect(session=...)`` takes), ``session``, ``start``, ``end``,
        and how many ``workers``, ``jobs`` and ``hosts`` wrote points (see :mod:`.sessions`)."""
        return _sessions.table(self.backend.session_rows(detail=True), self.ours)

    def not_found(self, what: str = "samples") -> str:
        """One line: ``what`` was not found in :meth:`scope`, and what the source holds outside it."""
        wide = self.backend.widened()
        first, last = wide.first_time(), wide.last_time()
        if first is None:
            dags = wide.dag_points()
            pending = pending_notes(self.undelivered) if self.undelivered is not None else []
            there = (
                "the source holds no samples at all"
                if dags.empty
                else f"the workers wrote no samples there, though the scheduler recorded {dags['dag'].nunique()} DAG(s)"
            )
            if pending:  # kept aside: InfluxDB refused them, or they were not delivered
                there += ": " + "; ".join(pending)
            elif not dags.empty:  # GPU-only tracking, no GPU
                there += f": if only GPU metrics were tracked, {NO_GPU}"
        else:
            there = f"the source holds samples from {_iso(first)} to {_iso(last)}"
            for key in sorted(k for k in self.backend.tags if k != _sessions.SESSION):
                there += f", {key} in {wide.tag_values(key)}"
            if self.backend.session is not None:
                found = _sessions.order(wide.session_rows())
                there += f", sessions (newest first) {[_sessions.name(s) for s in found[::-1]][:10]}"
        return f"no {what} {self.scope()}; {there}"

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close what :func:`connect` opened (HTTP sessions, the Flux client); closing twice is harmless."""
        if not self.closed:
            self.closed = True
            self.backend.close()

    # --- what exists -------------------------------------------------------
    def workers(self) -> list[str]:
        """Worker addresses in index order (natural sort of the address)."""
        if self._workers is None:
            found = self.backend.tag_values("worker")
            if foreign := sorted(w for w in found if not self.ours(w)):
                why = "not a worker of this session" if self._own is not None else "not a Dask worker address"
                self.skip_note(
                    f"skipped the series of worker tag(s) {foreign[:5]}{' ...' if foreign[5:] else ''} "
                    f"({why}; another tool's points?)"
                )
            self._workers = sorted((w for w in found if self.ours(w)), key=_names.natural_key)
        return list(self._workers)

    def worker_map(self) -> dict[int, str]:
        """``{index: address}``: the numbering every ``workers=[...]`` and CSV file uses."""
        return dict(enumerate(self.workers()))

    def jobs(self) -> list[int]:
        """Job numbers that have samples (job 0, "nothing ran yet", is not a job)."""
        return jobtags.distinct(self.backend.tag_values("job"))

    def fields(self) -> dict[str, list[str]]:
        """``{measurement: [fields]}`` present in the data."""
        if self._fields is None:
            self._fields = self.backend.fields()
        return self._fields

    def metrics(self) -> list[str]:
        """Names of the metrics present in the time range and tags (the default columns of a worker's table)."""
        return [m.name for m in _names.default_metrics(self.fields())]

    @property
    def origin_ns(self) -> int:
        """Collection start (ns): ``start`` if given, else the first sample; ``timestamp`` counts from it."""
        if self._origin_ns is None:
            first = self.backend.first_time()
            if first is None:
                raise QueryError(self.not_found())
            self._origin_ns = first
        return self._origin_ns

    def dags(self, job: Optional[int] = None) -> pd.DataFrame:
        """One row per DAG: ``dag``, ``job``, ``status``, ``submitted``, ``ended``, ``duration`` (s), ``tasks``,
        ``label``, ``session``. A row never mixes sessions: each end belongs to the latest submission of its
        DAG before it in its session (so also where a session without id, ``unnamed``, holds several runs)."""
        points = self.backend.dag_points()
        points = points[[c for c in points.columns if c in DAG_POINT_COLUMNS]]  # not extra tags (a "run" tag)
        cols = ["dag", "job", "status", "submitted", "ended", "duration", "tasks", "label", "session"]
        if points.empty:
            return pd.DataFrame(columns=cols)
        session = points["session"] if "session" in points.columns else pd.Series(None, index=points.index)
        points = points.assign(
            time=pd.to_numeric(points["time"]).astype("int64"),
            session=session.astype(object).where(session.notna(), "").astype(str),
            dag=pd.to_numeric(points["dag"]).astype(int),
        ).sort_values("time", kind="stable")
        submit = points[points["event"] == "submit"]
        submit = submit.assign(_nth=submit.groupby(["session", "dag"]).cumcount())
        end = pd.merge_asof(
            points[points["event"] == "end"].drop(columns=["job", "tasks", "label"], errors="ignore"),
            submit[["time", "session", "dag", "_nth"]].rename(columns={"time": "submit_time"}),
            left_on="time",
            right_on="submit_time",
            by=["session", "dag"],
        ).dropna(subset=["_nth"])
        key = ["session", "dag", "_nth"]
        end = end.assign(_nth=end["_nth"].astype(int)).drop_duplicates(key, keep="last").set_index(key)
        submit = submit.set_index(key)
        out = pd.DataFrame(
            {
                "job": submit["job"].astype(int),
                "status": end["status"].reindex(submit.index).fillna("running"),
                "submitted": pd.to_datetime(submit["time"], unit="ns", utc=True),
                "ended": pd.to_datetime(end["time"].reindex(submit.index), unit="ns", utc=True),
                "duration": pd.to_numeric(end["duration"].reindex(submit.index)),
                "tasks": pd.to_numeric(submit["tasks"]).astype(int),
                "label": submit["label"],
            }
        ).reset_index()
        out = out.sort_values(["session", "submitted", "dag"], kind="stable").reset_index(drop=True)
        out["session"] = out["session"].map(_sessions.name)
        if job is not None:
            jobs = sorted(out["job"].unique().tolist())
            if int(job) not in jobs:
                raise ValueError(f"job {job} has no DAGs; jobs: {jobs} ({self.scope()})")
            out = out[out["job"] == int(job)].reset_index(drop=True)
        return out[cols]

    def delivery(self) -> pd.DataFrame:
        """Each sender's last ``delivery`` counters in range (a stopped session's: its final ones): ``host``,
        ``worker`` (the sender: a worker address, ``scheduler`` or ``agent-<host>``), ``sink``, ``time`` and
        the counters (:data:`~dask_influx_metrics.schema.DELIVERY_FIELDS`, cumulative since the sender started)."""
        keys = ["host", "worker", "sink"]
        points = self.backend.points(schema.DELIVERY, [*keys, *schema.DELIVERY_FIELDS])
        columns = [*keys, "time", *schema.DELIVERY_FIELDS]
        if points.dropna(subset=["time"]).empty:
            return pd.DataFrame(columns=columns)
        last = points.sort_values("time", kind="stable").groupby(keys, dropna=False).tail(1)
        last = last.assign(time=pd.to_datetime(pd.to_numeric(last["time"]), unit="ns", utc=True))
        return last[columns].sort_values(keys, kind="stable").reset_index(drop=True)

    # --- selections --------------------------------------------------------
    def select_workers(self, workers) -> list[tuple[int, str]]:
        known = self.workers()
        if not known:
            raise QueryError(self.not_found("worker samples"))
        if workers is None:
            return list(enumerate(known))
        if isinstance(workers, (int, str)):
            workers = [workers]
        out = []
        for w in workers:
            if isinstance(w, str) and w in known:
                out.append((known.index(w), w))
            elif isinstance(w, int) and not isinstance(w, bool) and 0 <= w < len(known):
                out.append((w, known[w]))
            else:
                raise ValueError(f"no worker {w!r}; workers: {dict(enumerate(known))} ({self.scope()})")
        return out

    def check_job(self, job) -> Optional[int]:
        if job is None:
            return None
        jobs = self.jobs()
        if isinstance(job, bool) or not isinstance(job, int) or job not in jobs:
            raise ValueError(f"no job {job!r}; jobs: {jobs} ({self.scope()})")
        return job

    def resolve_metrics(self, names) -> list[_names.Metric]:
        """Metric names (default: all present) -> the :class:`~.metricnames.Metric` to read; a name that is
        unknown, failed on the workers or was not collected raises, saying what is present."""
        fields = self.fields()
        if names is None:
            metrics = _names.default_metrics(fields)
        else:
            names = [names] if isinstance(names, str) else list(names)
            unknown = _names.unknown(names, fields.get(schema.CUSTOM, ()))
            if failed := [_failed(n, self.failed_metrics[n]) for n in unknown if n in self.failed_metrics]:
                raise ValueError("; ".join(failed) + f"; no samples of it {self.scope()}")
            if unknown:
                raise ValueError(
                    f"unknown metric(s) {unknown}; present {self.scope()}: {self.metrics()} (known: "
                    "tracking names, measurement.field, custom metrics; see `metrics`)"
                )
            metrics = _names.resolve(names, fields.get(schema.CUSTOM, ()))
        absent = [m for m in metrics if m.field not in fields.get(m.measurement, ())]
        if absent:
            names = [m.name for m in absent]
            kept = "; ".join(k for k in (self.kept(m.measurement, m.field) for m in absent) if k)
            if kept:  # written, but not into this InfluxDB: say so, and where they are
                raise ValueError(f"metric(s) {names} have no samples {self.scope()}: {kept}")
            gpu = schema.GPU not in fields and any(m.measurement == schema.GPU for m in absent)
            why = f"; {NO_GPU}" if gpu else ""
            raise ValueError(f"metric(s) {names} were not collected{why}; present: {self.metrics()} ({self.scope()})")
        return metrics

    # --- hosts and GPUs (host metrics are read by host: :mod:`dask_influx_metrics.client.hosts`) ---
    def hosts(self) -> dict[str, str]:
        """``{worker address: host}``, from the ``host`` tag of each worker's own points."""
        if self._hosts is None:
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
        (what counts a GPU several workers share once in summaries); ``worker/index`` where a point
        has no ``uuid`` (older data)."""
        if self._gpu_ids is None:
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

    def host_longs(self, workers, fields: list[str]) -> dict[str, pd.DataFrame]:
        """``{worker: the host series of its host}`` for joining into worker tables (read once per host)."""
        where, empty = self.hosts(), pd.DataFrame(columns=["time", "job", "dag", "worker", *fields])
        series = {h: self.host_series(h, fields) for h in {where.get(w) for w in workers} - {None}}
        return {w: series.get(where.get(w), empty) for w in workers}

    def disk_points(self) -> pd.DataFrame:
        """Every ``disk`` point in range written by this Store's workers (one per filesystem and host reading):
        ``time`` and :data:`DISK_COLUMNS`."""
        if self._disk_points is None:
            points = self.backend.points(schema.DISK, DISK_COLUMNS)
            if not points.empty:
                points = points[points["worker"].map(self.ours).astype(bool)].reset_index(drop=True)
            self._disk_points = points
        return self._disk_points
