"""``Monitor``: the client-side handle, compatible with the old dask-metrics API.

All state lives on the cluster (the scheduler plugin), not in this object, so
a later, different ``Client`` can build ``Monitor(client)`` and ``stop()``
what an earlier one started.

Example
-------
>>> from dask.distributed import Client, LocalCluster          # doctest: +SKIP
>>> client = Client(LocalCluster(n_workers=2))                   # doctest: +SKIP
>>> monitor = Monitor(client, gpu_source="simulated")            # doctest: +SKIP
>>> monitor.attach(tracking=["compute-util", "tasks"], polling_interval=100)  # doctest: +SKIP
>>> monitor.start()                                              # doctest: +SKIP
>>> client.submit(sum, [1, 2]).result()                          # doctest: +SKIP
3
>>> monitor.stop()                                               # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import shutil

from .. import _dask
from ..config import SETTINGS, Settings, overrides_from_kwargs
from ..names import JOBS_PLUGIN, NEW_JOB_OP
from ..scheduler import session as scheduler_session
from ..scheduler.plugin import JobPlugin
from ..sinks import remove_spool
from ..worker import custom
from . import destinations
from .destinations import CLUSTER

logger = logging.getLogger(__name__)
# settings never logged: secrets, and what may carry them (a user:password@ URL) or name a user
_PRIVATE = {s.key for s in SETTINGS if s.secret} | {"influxdb.url", "influxdb.username"}


async def _on_scheduler(dask_scheduler=None, action="state"):
    """Runs on the scheduler (via ``run_on_scheduler``): read the state, or detach."""
    plugin = dask_scheduler.plugins.get(JOBS_PLUGIN)
    if plugin is None:
        return None
    if action == "clear":
        return plugin.clear()
    if action == "detach":
        await plugin.close()
        dask_scheduler.remove_plugin(name=JOBS_PLUGIN)
    return plugin.state()


def _names(tracking) -> list | None:
    """A tracking list as given: one name as a string is that name (not its letters)."""
    return None if tracking is None else [tracking] if isinstance(tracking, str) else list(tracking)


class Monitor:
    """Collects GPU, host and custom metrics on every worker of ``client``'s cluster.

    ``settings`` are keyword overrides of the ``influx-metrics`` Dask config
    (see :data:`dask_influx_metrics.config.KWARGS`), e.g. ``sink="udp"``,
    ``gpu_source="simulated"``; they apply to every ``attach``.
    """

    def __init__(self, client, **settings):
        self.client = client
        self._settings = overrides_from_kwargs(**settings)
        self._attached = None  # (overrides, custom metrics payload) of this Monitor's attach(): what start() runs
        self._store = self._store_key = (
            None  # query()'s Store, reused while _store_key (session, source, options) holds
        )
        self._copy = None  # the local copy of a spool read through the cluster, removed with its Store

    # --- old dask-metrics API --------------------------------------------
    def attach(
        self,
        tracking=None,
        custom_metrics=None,
        job_type="client",
        polling_interval=None,
        mem_limit=None,
        dump_loc=None,
        **settings,
    ) -> Settings:
        """Validate the options and install the scheduler plugin (sampling starts at ``start()``).

        ``tracking`` names metrics (default: all, see docs/data-contract.md), ``custom_metrics``
        are functions decorated with ``@custom_metric``, ``job_type`` is
        ``"client"`` (each client connection is a job) or ``"manual"`` (only
        ``new_job()`` changes the job), ``polling_interval`` is in ms,
        ``mem_limit`` lines are held in worker memory before being spooled to
        ``dump_loc``. Raises ``ValueError``/``TypeError`` naming any bad option;
        returns the resolved settings as this client sees them.

        >>> monitor.attach(["mem-util", "compute-util"], job_type="manual")  # doctest: +SKIP
        """
        overrides = {
            **self._settings,
            **overrides_from_kwargs(
                tracking=_names(tracking),
                job_type=job_type,
                polling_interval=polling_interval,
                mem_limit=mem_limit,
                dump_loc=dump_loc,
                **settings,
            ),
        }
        resolved = Settings.for_session(overrides)  # raises on anything invalid
        metrics = custom.validate(custom_metrics)  # names and signatures
        state = self._state(required=False)
        if state and state["session"]:
            raise RuntimeError(f"monitoring session {state['session']['id']} is running; stop() it before attach()")
        payload = _dask.dumps(metrics) if metrics else b""
        if state:
            self.client.run_on_scheduler(_on_scheduler, action="detach")
        temporary = state["temporary_spool"] if state else ()  # the earlier sessions' files: shutdown() deletes them
        self.client.register_plugin(JobPlugin(overrides, payload, temporary_spool=temporary), name=JOBS_PLUGIN)
        self._attached = (overrides, payload)
        return resolved

    def start(self, tracking=None) -> dict:
        """Start sampling on every worker, now and on workers that join later.

        Job and DAG numbers restart from 1. The session runs with the settings
        and custom metrics of this Monitor's ``attach`` (another client's later
        ``attach`` on the cluster does not change them); a Monitor that did not
        attach starts what is attached. ``tracking`` replaces the list given
        to ``attach``. Returns the session (``id``, ``start`` time) and
        ``destinations``: where each worker (and the scheduler) sends its
        samples, also logged once here and kept in :meth:`jobs`.

        >>> session = monitor.start()  # doctest: +SKIP
        """
        state = self._state()
        tracking = _names(tracking)
        overrides = self._attached[0] if self._attached else state["overrides"]
        if tracking is not None:
            Settings.resolve({**overrides, "tracking": tracking})  # raises on bad names
        elif not self._attached:  # attached by another Monitor, client or the preload: say what is reused
            shown = {k: v for k, v in state["overrides"].items() if k not in _PRIVATE}
            logger.warning(
                "influx-metrics: start() without attach() on this Monitor reuses the settings attached "
                "to %s earlier: %s",
                self.client.scheduler.address,
                ", ".join(f"{k}={v!r}" for k, v in sorted(shown.items())) or "the defaults",
            )
        # the same start path as --preload; a worker's setup error stops the session and lands here
        session = self.client.run_on_scheduler(scheduler_session.start, tracking=tracking, attached=self._attached)
        scheduler_session.user_log.info(  # a "distributed.*" logger: shown where Dask's own lines are
            "influx-metrics session %s: %s",
            session["id"],
            "; ".join(
                f"{who}: {scheduler_session.describe(where)}" for who, where in sorted(session["destinations"].items())
            ),
        )
        return session

    def stop(self, force=False) -> dict:
        """Stop sampling on all workers (flushing their sinks) and end the session.

        Works from any client connected to the cluster. ``force`` is accepted
        for compatibility; stopping never waits for running jobs.

        >>> Monitor(other_client).stop()  # doctest: +SKIP
        """
        state = self._state()
        if state["session"] is None:  # checked here: an error raised on the scheduler logs a traceback there
            self.client.run_on_scheduler(scheduler_session.stop, missing_ok=True)  # workers left sampling, if any
            last = state["last_session"]
            raise RuntimeError(
                f"no monitoring session is running on {self.client.scheduler.address}"
                + (f"; the last one, {last['id']}, has already stopped" if last else "")
            )
        return self.client.run_on_scheduler(scheduler_session.stop)

    def new_job(self, job=None, label=None) -> None:
        """Manual job mode: graphs submitted after this call belong to a new job.

        ``job`` sets the number; by default it is the next one. ``label`` names
        the job in its DAGs' ``label`` (default: the client's id). The message
        travels on this client's graph stream, so it is ordered exactly with
        this client's submissions.

        >>> monitor.new_job(label="etl")  # doctest: +SKIP
        """
        state = self._state()
        if state["job_type"] != "manual":
            raise ValueError("new_job() needs attach(job_type='manual'); this monitor counts one job per client")
        if job is not None and (isinstance(job, bool) or not isinstance(job, int) or job < 1):
            raise ValueError(f"job must be a positive integer, got {job!r}")
        if label is not None and not isinstance(label, str):
            raise ValueError(f"label must be a string, got {label!r}")
        _dask.send_on_client_stream(self.client, {"op": NEW_JOB_OP, "job": job, "label": label})

    def shutdown(self) -> None:
        """Stop any running session, remove the monitor from the cluster, delete the temporary spool
        files its sessions left on the workers and the scheduler (under the default ``spool.directory``;
        a folder you configured is kept), and close :meth:`query`'s Store.

        >>> monitor.shutdown()  # doctest: +SKIP
        """
        self._close_store()
        self.client.run_on_scheduler(scheduler_session.stop, missing_ok=True)
        state = self._state(required=False)
        if state is not None:
            self.client.run_on_scheduler(_on_scheduler, action="detach")
            self._remove_spool(state["temporary_spool"])

    def clear_metrics(self) -> None:
        """Forget the samples collected so far, everywhere they are on the cluster.

        Deletes the spool files of this monitor's sessions on every worker and
        the scheduler (a running session keeps spooling into fresh files). With
        InfluxDB sinks (udp, http) nothing is deleted from InfluxDB, but later
        reads (:meth:`query`, :meth:`to_csv`, :meth:`get_peaks`,
        :meth:`peak_memory`) start at the time of the clear.

        >>> monitor.clear_metrics()  # doctest: +SKIP
        """
        self._state()
        self._close_store()
        folders, running = self.client.run_on_scheduler(_on_scheduler, action="clear")
        self._remove_spool(folders, keep=running)

    def _remove_spool(self, folders, keep=()) -> None:
        if folders:
            self.client.run(remove_spool, list(folders), list(keep))
            self.client.run_on_scheduler(remove_spool, list(folders), list(keep))

    def delivery(self) -> dict:
        """Each worker's sink counters while a session runs: ``{worker: [{"kind": "udp",
        "points_sent", "points_dropped", "refused", ...}]}``. ``refused`` counts datagrams a
        loopback Telegraf address refused (nothing listened); see docs/sinks.md.

        Once the session has stopped there are none: a ``RuntimeError`` says so, and where its senders wrote
        their last counters (``delivery`` points, with the samples: ``monitor.query().delivery()``).

        >>> monitor.delivery()  # doctest: +SKIP
        {'tcp://127.0.0.1:4012': [{'kind': 'udp', 'points_sent': 120, 'points_dropped': 0, ...}]}
        """
        from ..worker.plugin import delivery_counters

        state = self._state()
        if state["session"] is None:
            last = state["last_session"]
            if last is None:
                raise RuntimeError(f"no monitoring session has run on {self.client.scheduler.address}; start() one")
            where = sorted({scheduler_session.describe(d) for d in (state.get("destinations") or {}).values()})
            stopped = _dt.datetime.fromtimestamp(last["stop"], _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            raise RuntimeError(
                f"the monitoring session {last['id']} stopped at {stopped}: no sink counts any more. Its senders "
                f"wrote their last counters as `delivery` points when they stopped, with the samples "
                f"({'; '.join(where) or 'no destination recorded'}): read them with monitor.query().delivery()"
            )
        return self.client.run(delivery_counters)

    def request_metrics(self) -> list:
        """The samples so far, one table per worker in worker index order (what :meth:`to_csv` writes).

        >>> monitor.request_metrics()[0].columns  # doctest: +SKIP
        """
        from .tables import worker_tables

        return worker_tables(self.query())

    # --- analysis (old dask-metrics API) ----------------------------------

    def query(self, source=None, **kwargs):
        """A :class:`~dask_influx_metrics.query.Store` over this session's samples.

        By default where the workers reported sending the samples (see
        :mod:`dask_influx_metrics.client.destinations`): the spool when this machine
        can see it, else the InfluxDB they wrote to (credentials from this
        reader's settings), else their spool through the cluster (copied here
        over Dask comms, see :mod:`dask_influx_metrics.client.clusterspool`;
        ``source="cluster"`` forces that), narrowed to the session (its id, from
        the last :meth:`clear_metrics` on) and extra tags.
        ``source`` (a URL or spool folder) and ``kwargs`` go to
        :func:`~dask_influx_metrics.query.connect` instead. Samples the HTTP
        sink kept on disk (the spool's ``undelivered/`` and ``refused/``, when
        this machine sees it) are not in InfluxDB: ``query().notes`` says how
        many; ``dask-influx-metrics replay <folder> --source <url>`` writes them (reading never does).

        Once the session has stopped, the Store (and its HTTP connections) is
        kept for the next call with the same ``source`` and ``kwargs``
        (``get_peaks``, ``peak_memory``, ``to_csv``); while it runs, each call
        reads afresh. The Monitor owns the Store: a new one closes the old,
        and :meth:`shutdown` closes the last.

        >>> monitor.query().jobs()  # doctest: +SKIP
        [1, 2, 3]
        """
        from . import query

        state = self._state()
        session = state["session"] or state["last_session"]
        if session is None:
            raise RuntimeError("no monitoring session has run yet; start() one first")
        reader = Settings.resolve({**state["overrides"], **self._settings})  # credentials: this reader's own
        options = {  # no stop: the session's id bounds it (its last samples and counters come after stop())
            "start": session.get("cleared") or session["start"],
            "tags": reader.tags or None,
            "session": session["id"],  # its own points only, in a database that holds others too
        }
        if source is not None:
            args = (source,)
        else:
            where = destinations.resolve(state.get("destinations") or {}, session["id"], reader)
            args = where.args
            options.update(where.options)
        own = sorted(w for w in state.get("destinations") or {} if w != "scheduler")
        if own:  # only the session's own series: another tool may write to the same database
            options["workers"] = tuple(own)
        options.update(kwargs)
        key = (session["id"], args, options)
        running = state["session"] is not None  # samples still arriving: the Store's caches would go stale
        if running or self._store is None or self._store.closed or self._store_key != key:
            self._close_store()
            if args == (CLUSTER,):
                args = (self._copy_spool(state, session),)
            try:
                self._store, self._store_key = query.connect(*args, **options), key
            except query.QueryError as e:
                if source is not None or not str(e).startswith("cannot reach"):
                    raise
                raise query.QueryError(
                    destinations.unreachable(e, state.get("destinations") or {}, reader.configured)
                ) from None
        self._store.failed_metrics = dict(session.get("failed_metrics") or {})
        return self._store

    def _copy_spool(self, state, session) -> str:
        import tempfile

        from . import clusterspool

        self._copy = tempfile.mkdtemp(prefix="dask-influx-metrics-copy-")  # 0700
        return clusterspool.fetch(self.client, state["destinations"], session["id"], self._copy)

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = self._store_key = None
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None

    def get_peaks(self, metric="mem-util", workers=None, per_job=True, **kwargs) -> list:
        """Peak ``metric`` per worker and GPU: ``[{job: [peak per GPU]}, ...]`` or, with
        ``per_job=False``, ``[[peak per GPU], ...]``; always a list, in worker index order.

        ``workers`` are worker indices (address order) or addresses. Peaks are
        computed by InfluxDB where it can (``MAX ... GROUP BY``).

        A job's peak counts only the samples at which that job had tasks
        executing (``dag != "0"``, the job in the ``job`` tag); idle samples
        count for no job. ``"total-mem"``: device memory in use on that GPU
        (bytes, every process on it) while the job ran on a worker using it.
        ``"worker-gpu-mem"``: the GPU memory (bytes) held by the worker's own
        process tree while the job ran on it. ``per_job=False`` uses every sample.

        >>> monitor.get_peaks("compute-util", workers=[0, 1])  # doctest: +SKIP
        [{1: [97.0, 88.5], 2: [40.0, 12.0]}, {1: [91.0, 90.0]}]
        """
        from .peaks import get_peaks

        return get_peaks(self.query(**kwargs), metric, workers=workers, per_job=per_job)

    def accounting(self, job=None, **kwargs):
        """Per-job GPU accounting: busy, SM- and tensor-active GPU-seconds, energy, GPU memory and CPU seconds
        per job and GPU, per job, and the idle rows, from the agents' running totals (tracking name
        ``accounting``); ``kwargs`` choose the source as :meth:`query` does. See
        :func:`dask_influx_metrics.client.accounting.accounting`.

        >>> monitor.accounting(job=1)  # doctest: +SKIP
        """
        from .accounting import accounting

        return accounting(self.query(**kwargs), job=job)

    def peak_memory(self, workers=None) -> list:
        """The first dask-metrics API: peak ``mem-util`` per GPU, ``[[12, 8], [4, 0]]``.

        >>> monitor.peak_memory()  # doctest: +SKIP
        """
        return self.get_peaks("mem-util", workers=workers, per_job=False)

    def to_csv(self, path, fname="worker", clear_dir=True, metrics=None, **kwargs) -> list:
        """One CSV per worker, ``<path>/<fname>_<i>.csv`` (old layout), plus ``workers.csv``.

        ``clear_dir`` removes earlier ``<fname>_*.csv`` files there first
        (nothing else). Returns the paths written, ``workers.csv`` last.

        >>> monitor.to_csv("out/")  # doctest: +SKIP
        """
        from .csvfiles import to_csv

        store = self.query(**kwargs)
        if not kwargs:  # the session's own source: every worker that sampled must be in the export
            from .query import QueryError
            from .query.store import NO_GPU

            sampled = {w for w in self._state().get("destinations") or {} if w != "scheduler"}
            present = store.workers()
            missing = sorted(sampled - set(present))
            if missing and present:  # none present: to_csv says what the source holds
                raise QueryError(
                    f"worker(s) {missing} sampled in this session but wrote no samples "
                    f"{store.scope()}; no CSV written ({store.kept_gpu(metrics) or NO_GPU})"
                )
        return to_csv(store, path, fname=fname, clear_dir=clear_dir, metrics=metrics)

    def report(self, path="gpu-report.html", title=None, **kwargs) -> str:
        """Write the one-file HTML report of the session (see :mod:`.report`; needs the ``[report]``
        extra) to ``path`` and return it; ``kwargs`` choose the source as :meth:`query` does."""
        from .report import report

        return report(self.query(**kwargs), path, title=title)

    @staticmethod
    def peaks_from_csv(path, metric="mem-util", workers=None, per_job=True, fname="worker") -> list:
        """Peaks from files written by :meth:`to_csv`, in the shapes of :meth:`get_peaks`.

        ``workers=[2]`` reads ``worker_2.csv`` (never ``worker_10.csv``).

        >>> Monitor.peaks_from_csv("out/", "compute-util", workers=[0], per_job=False)  # doctest: +SKIP
        [[97.0, 88.5]]
        """
        from . import csvfiles, peaks
        from .tables import table_metrics

        tables = csvfiles.read_tables(path, workers=workers, fname=fname, metrics=[metric])
        if not any(metric in table_metrics(t) for t in tables):
            files = csvfiles.csv_files(path, fname)
            present = {m for w in (files if workers is None else workers) for m in csvfiles.file_metrics(files[w])}
            raise ValueError(
                f"metric {metric!r} is not in the CSV files under {os.fspath(path)!r}; present: {sorted(present)}"
            )
        tidy = peaks.from_tables(tables, metric, per_job)
        return peaks.to_lists(tidy, per_job, [t.attrs["worker_index"] for t in tables])

    # --- live ------------------------------------------------------------
    def live(self) -> list[dict]:
        """Each job's figures now, as the dashboard's GPU Jobs page shows them (``job``, ``label``, ``util``,
        ``sm``, ``mem``, ``gpus``, ``busy_s``, ``energy_j``, ``dags``; None: not known): docs/dashboard.md."""
        from .livetable import on_scheduler

        state = self.client.run_on_scheduler(on_scheduler)
        return state["jobs"] if state else []

    def _repr_html_(self) -> str:
        """A notebook's view: the live per-job table and a link to the dashboard page."""
        from .livetable import to_html

        return to_html(self.client)

    # --- introspection ---------------------------------------------------
    def jobs(self) -> dict:
        """Jobs and DAGs of the current (or last) session, from the scheduler,
        ``shared_gpus``: GPUs that several workers of one host use (``host``, ``uuid``, ``workers``),
        and ``destinations``: where each worker (and the scheduler) sends its samples
        (``sinks``, ``telegraf``, ``influxdb`` url/database, ``spool`` folder; never credentials).

        >>> monitor.jobs()["dags"][1]["status"]  # doctest: +SKIP
        'ok'
        """
        state = self._state()
        return {
            k: state[k] for k in ("job_type", "jobs", "dags", "session", "last_session", "shared_gpus", "destinations")
        }

    def _state(self, required=True) -> dict | None:
        state = self.client.run_on_scheduler(_on_scheduler, action="state")
        if state is None and required:
            raise RuntimeError(f"no monitor is attached to {self.client.scheduler.address}; call attach() first")
        return state
