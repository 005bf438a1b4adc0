"""The Store: questions about one set of collected samples, whichever backend holds them (see
:mod:`dask_influx_metrics.client.query`)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import pandas as pd

from ... import jobtags, schema
from .. import accounting as _accounting
from .. import peaks as _peaks
from .. import summary as _summary
from .. import tables as _tables
from ..hosts import HostQuestions
from ..tasks import TaskQuestions
from . import sessions as _sessions
from .base import DEVICE_MEASUREMENTS, Backend, QueryError, kept_lines, pending_notes

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


class Store(TaskQuestions, HostQuestions):
    """Questions about one set of collected samples (see the module docstring).

    A context manager: leaving ``with`` closes the backend's connections. Tasks, activity,
    GPU use during tasks and the HTML report: :mod:`dask_influx_metrics.client.tasks`; host
    metrics, read by host: :mod:`dask_influx_metrics.client.hosts`.

    >>> with connect("/tmp/dask-influx-metrics-1000") as db:  # doctest: +SKIP
    ...     jobs = db.jobs()
    """

    #: workers fetched at once by :meth:`worker_tables`
    parallel = 4

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
        known = _tables.resolve([n for n in names if not _tables.unknown([n])])
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
            self._workers = sorted((w for w in found if self.ours(w)), key=_tables.natural_key)
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
        """Names of the metrics present in the time range and tags (the default columns of :meth:`worker_tables`)."""
        return [m.name for m in _tables.default_metrics(self.fields())]

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
    def _select_workers(self, workers) -> list[tuple[int, str]]:
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

    def resolve_metrics(self, names) -> list[_tables.Metric]:
        fields = self.fields()
        if names is None:
            metrics = _tables.default_metrics(fields)
        else:
            names = [names] if isinstance(names, str) else list(names)
            unknown = _tables.unknown(names, fields.get(schema.CUSTOM, ()))
            if failed := [_failed(n, self.failed_metrics[n]) for n in unknown if n in self.failed_metrics]:
                raise ValueError("; ".join(failed) + f"; no samples of it {self.scope()}")
            if unknown:
                raise ValueError(
                    f"unknown metric(s) {unknown}; present {self.scope()}: {self.metrics()} (known: "
                    "tracking names, measurement.field, custom metrics; see `metrics`)"
                )
            metrics = _tables.resolve(names, fields.get(schema.CUSTOM, ()))
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

    # --- tables ------------------------------------------------------------
    def worker_tables(
        self,
        job: Optional[int] = None,
        metrics=None,
        workers=None,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> dict[str, pd.DataFrame]:
        """``{address: table}`` in index order; see :mod:`dask_influx_metrics.client.tables` for the columns.

        Only the fields behind ``metrics`` (default: all present) are read,
        one worker at a time, filtered by ``job`` on the server; host metrics
        are read once per host and joined by time (:mod:`dask_influx_metrics.client.hosts`).
        ``progress(done, total)`` is called after each worker.
        """
        chosen = self._select_workers(workers)
        job = self.check_job(job)
        metrics = self.resolve_metrics(metrics)
        fields = self.fields()
        wanted: dict[str, list[str]] = {}
        for m in metrics:
            wanted.setdefault(m.measurement, []).append(m.field)
        if schema.WORKER in fields:  # running tasks go in every table
            wanted.setdefault(schema.WORKER, [])
            wanted[schema.WORKER] += [f for f in ("tasks", "running") if f in fields[schema.WORKER]]
            if "tasks" in fields[schema.WORKER] and not any(m.name == "tasks" for m in metrics):
                metrics = metrics + _tables.resolve(["tasks"])
        origin = self.origin_ns
        hosts = self.host_longs([w for _, w in chosen], wanted[schema.HOST]) if schema.HOST in wanted else {}
        gpus = self.gpu_ids() if schema.GPU in wanted else {}

        def one(item):
            i, worker = item
            frames = {
                m: None if m == schema.HOST else self.backend.frame(m, list(dict.fromkeys(fs)), worker, job)
                for m, fs in wanted.items()
            }
            table = _tables.build(frames, metrics, origin, worker, i, host=hosts.get(worker))
            if worker in gpus:
                table.attrs[_summary.GPUS] = gpus[worker]
            return worker, table

        out = {}
        # A few workers in flight: the server builds one answer while we parse another.
        with ThreadPoolExecutor(max_workers=min(self.parallel, len(chosen))) as pool:
            for done, (worker, table) in enumerate(pool.map(one, chosen), 1):
                out[worker] = table
                if progress:
                    progress(done, len(chosen))
        return out

    # --- peaks, summaries, CSV -------------------------------------------
    def peaks(
        self, metric: str, per_job: bool = True, workers=None, job: Optional[int] = None, server: bool = True
    ) -> pd.DataFrame:
        """Tidy peaks of one metric (see :mod:`dask_influx_metrics.client.peaks`).

        ``server=True`` lets the backend compute ``MAX ... GROUP BY worker,
        index, job`` (InfluxQL does it on the server; per job over busy
        samples only, ``dag != '0'``); ``False`` computes from the per-worker
        tables. Both give the same numbers. A host metric's peaks are its
        host's (``GROUP BY host, job``, or from :meth:`host_tables`), one row
        set for each worker of the host.
        """
        resolved = self.resolve_metrics([metric])
        if len(resolved) != 1:
            raise ValueError(f"metric {metric!r} has several fields; name one: {[x.name for x in resolved]}")
        m = resolved[0]
        chosen = self._select_workers(workers)
        job = self.check_job(job)
        if m.measurement == schema.HOST:
            tidy = self.host_peaks(m, per_job, chosen, job, server)
        elif not server:
            tables = self.worker_tables(job=job, metrics=[m.name], workers=[w for _, w in chosen])
            tidy = _peaks.from_tables(list(tables.values()), m.name, per_job, m.unit)
        else:
            by = (
                ("worker",)
                + (("index",) if m.measurement in DEVICE_MEASUREMENTS else ())
                + (("job",) if per_job else ())
            )
            groups = self.backend.max_by(m.measurement, m.field, by, [w for _, w in chosen], job, busy=per_job)
            tidy = _peaks.from_groups(groups, m, {w: i for i, w in chosen}, per_job)
        if job is not None and per_job:
            tidy = tidy[tidy["job"] == job].reset_index(drop=True)
        return tidy

    def accounting(self, job: Optional[int] = None) -> pd.DataFrame:
        """Per-job GPU accounting from the samplers' running totals (tracking name ``accounting``): one row per
        job and GPU, per job and host (CPU), per job (totals), and the idle rows (``job`` <NA>); see
        :mod:`dask_influx_metrics.client.accounting`. With a time range, each total's increase within it."""
        fields, by = list(_accounting.FIELDS), _accounting.BY
        last = self.backend.last_by(schema.ACCOUNTING, fields, by)
        before = None
        if self.backend.start_ns is not None and not last.empty:  # rows that began before the range
            earlier = self.backend.widened()
            earlier.tags, earlier.stop_ns = dict(self.backend.tags), self.backend.start_ns - 1
            before = earlier.last_by(schema.ACCOUNTING, fields, by)
        out = _accounting.table(_accounting.increase(last, before))
        if job is not None:
            known = sorted(j for j in out["job"].dropna().unique())
            if job not in known:
                raise ValueError(f"job {job!r} has no accounting rows; jobs: {known} ({self.scope()})")
            out = out[out["job"] == job].reset_index(drop=True)
        return out

    def get_peaks(self, metric: str = "mem-util", workers=None, per_job: bool = True, **kw) -> list:
        """The old ``get_peaks`` shapes: ``[{job: [peak per GPU]}, ...]`` or ``[[peak per GPU], ...]``.

        Per job, a peak is the largest value among the samples at which that
        job had tasks executing (``dag != "0"`` and the job in the ``job``
        tag); idle samples count for no job. ``"total-mem"``: device memory in
        use (bytes) on that GPU while the job ran: the whole device, every
        process on it. ``"worker-gpu-mem"``: the GPU memory (bytes) held by the
        worker's own process tree while the job ran on it. ``per_job=False``:
        the peak over every sample, idle ones included.
        """
        chosen = self._select_workers(workers)
        tidy = self.peaks(metric, per_job=per_job, workers=[w for _, w in chosen], **kw)
        return _peaks.to_lists(tidy, per_job, [i for i, _ in chosen])

    def summary(self, per_job: bool = True, workers=None, job: Optional[int] = None) -> pd.DataFrame:
        """GPU utilization per worker and its node's CPU, memory, disk and network (and per job): see
        :mod:`dask_influx_metrics.client.summary`; the node rows of a worker are its host's (:meth:`node_tables`).
        With ``job``: that job's rows only (``per_job`` then does not matter)."""
        present = self.metrics()
        names = [n for n in (_summary.GPU_METRIC, *_summary.MEMORY_METRICS) if n in present]
        nodes = [n for n in _summary.HOST_METRICS if n in present]
        if _summary.GPU_METRIC not in names and not nodes:
            raise ValueError(
                f"a summary needs compute-util or a host metric (host-cpu, host-mem, ...); present: {present}"
            )
        tables = self.worker_tables(job=job, metrics=names or nodes[:1], workers=workers)
        hosts = self.node_tables(list(tables)) if nodes else None
        frame = _summary.summarize(list(tables.values()), per_job=per_job or job is not None, hosts=hosts)
        for note in frame.attrs.get("notes", []):
            self.skip_note(note)
        return frame if job is None else frame[frame["job"] == job].reset_index(drop=True)

    def to_csv(
        self,
        path,
        fname: str = "worker",
        clear_dir: bool = False,
        metrics=None,
        workers=None,
        job: Optional[int] = None,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> list[str]:
        """One CSV per worker in the old layout, then ``workers.csv`` (see :mod:`dask_influx_metrics.client.csvfiles`);
        returns their paths."""
        from ..csvfiles import write_tables

        tables = self.worker_tables(job=job, metrics=metrics, workers=workers, progress=progress)
        empty = [w for w, t in tables.items() if t.empty]
        if empty:  # a header-only file would pass for an export
            kept = self.kept_gpu(metrics)
            raise QueryError(
                f"no samples for worker(s) {empty} {self.scope()}; no CSV written ("
                + (kept if kept else f"a worker without a GPU writes no GPU samples: {NO_GPU}")
                + ")"
            )
        return write_tables(list(tables.values()), path, fname=fname, clear_dir=clear_dir)
