"""Host readings in per-worker views: the one ``host`` series of each host, read by host.

With ``sampler.host-once`` (the default) one worker per host writes the ``host``
measurement, tagged with the jobs and DAGs executing on every worker of the host
(``dag="0"`` when none runs a task). So the client reads host metrics by host,
never by worker:

- **Tables** (:func:`.tables.worker_tables`, CSV, plots):
  each worker's rows get its host's reading taken at or before them (an as-of
  join, at most three host sampling intervals earlier: :func:`.tables.host_part`);
  the row keeps the worker's own ``job``/``dag``.
- **Peaks and summaries** of host metrics are the host's: computed from the host
  series with its union tags (per job: the samples at which the job had tasks
  executing on any worker of the host), then given to every worker of that host.
  Server-side (``MAX ... GROUP BY host, job``) and client-side (from
  :func:`host_tables`) agree by construction.
- **Older data** (every worker wrote its own host series, or ``host-once: false``)
  reads the same way: a worker's row takes its own reading of the same instant
  (the host series is all of the host's points), and a host's figures cover every
  worker's readings, each tagged with its own worker's jobs. Summaries weight each
  reading by the window before it, from the previous one of the host (:func:`.summary.weights`), so the
  interleaved readings of N writers share the host's time instead of each counting
  a whole interval.

A worker's host comes from its own points' ``host`` tag
(:meth:`~dask_influx_metrics.client.query.store.Store.hosts`).
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from .. import schema
from .query.metricnames import default_metrics
from .query.store import Store
from .tables import build, host_step_ns


def host_tables(store: Store, metrics=None, job: Optional[int] = None, hosts=None) -> dict[str, pd.DataFrame]:
    """``{host: table}``: one table per host of its host metrics (default all present), like a
    worker's table but with the host points' own ``job``/``dag`` (every worker of the host);
    ``attrs["interval"]`` is the seconds a row stands for where no later row tells (1/N of an
    interval where N workers wrote the host at once: older data). ``job``: points whose ``job`` tag holds it only."""
    chosen = (
        [m for m in store.resolve_metrics(metrics) if m.measurement == schema.HOST]
        if metrics is not None
        else [m for m in default_metrics(store.fields()) if m.measurement == schema.HOST]
    )
    out = {}
    for host in sorted(set(store.hosts().values()) if hosts is None else set(hosts) - {None}):
        long = store.host_series(host, [m.field for m in chosen], job)
        table = build({schema.HOST: long}, chosen, store.origin_ns, worker=host)
        table.attrs.update(host=host, interval=_row_seconds(long))
        out[host] = table
    return out


def host_tables_by_worker(store: Store, workers, metrics, job: Optional[int] = None) -> dict[str, pd.DataFrame]:
    """``{worker: its host's table}`` (:func:`host_tables`) for the worker addresses ``workers``."""
    where = store.hosts()
    tables = host_tables(store, metrics, job, hosts=[where.get(w) for w in workers])
    return {w: tables[where[w]] for w in workers if where.get(w) in tables}


def _row_seconds(long: pd.DataFrame) -> float:
    """Seconds one host point stands for: the writers' sampling interval, divided by the number of
    writers where several wrote the host at once (older data, or ``sampler.host-once: false``).
    Writers that took over from one another (the writer exited) wrote one after the other: 1."""
    step = host_step_ns(long)
    if not step:
        return 0.0
    writers = long.sort_values("time", kind="stable")["worker"].fillna("") if "worker" in long else pd.Series([""])
    changes = int((writers != writers.shift()).sum()) - 1
    together = writers.nunique() if changes > writers.nunique() - 1 else 1
    return step / 1e9 / together
