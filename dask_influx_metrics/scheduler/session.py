"""The one way a monitoring session starts and stops, on the scheduler.

``Monitor.start()`` / ``Monitor.stop()`` run :func:`start` / :func:`stop` here
through ``client.run_on_scheduler``; the ``--preload`` module calls :func:`start`
directly once it has installed the :class:`JobPlugin`. So a session begins the
same way whoever asks: the job plugin starts counting from job/DAG 1, then the
:class:`MetricsWorkerPlugin` is registered on the scheduler under its stable
name, which sets it up on every worker, present or future.

Example
-------
>>> client.run_on_scheduler(start, tracking=["mem-util"])  # doctest: +SKIP
{'id': '20261121T100000-000001', 'start': 1795255200.0, 'job_type': 'client'}
"""

from __future__ import annotations

import asyncio
import logging
import time

from .. import _dask
from ..names import JOBS_PLUGIN, WORKER_PLUGIN
from ..offloop import off_loop
from ..worker.agentlink import START_TIMEOUT
from ..worker.plugin import FOUND_TIMEOUT, MetricsWorkerPlugin

logger = logging.getLogger(__name__)
# where a user reads the scheduler's log: Dask shows its own "distributed.*" loggers at INFO
user_log = logging.getLogger("distributed.influx_metrics")
# s to wait for each worker's report of where its samples go: sent once its host's agent sampled it (the agent
# starting, then its first sample of the worker), or at once by a worker sampling itself
REPORT_TIMEOUT = START_TIMEOUT + FOUND_TIMEOUT


async def start(dask_scheduler, tracking=None, attached=None) -> dict:
    """Start the session and sampling on every worker; returns the session (``id``, ``start``)
    and ``destinations`` (worker address or ``"scheduler"`` -> where its samples go, see
    :func:`~dask_influx_metrics.sinks.destinations`), logged once here.

    ``attached``: the (overrides, custom metrics payload) of the starting Monitor's own
    ``attach``, which replace those on record: another client may have attached in between.
    ``tracking`` replaces the tracked metrics given at attach (validated by the
    caller). If a worker cannot set the plugin up, the session is stopped and
    that worker's error raised.
    """
    plugin = dask_scheduler.plugins.get(JOBS_PLUGIN)
    if plugin is None:
        raise RuntimeError(f"no monitor is attached to {dask_scheduler.address}; call attach() first")
    if attached is not None and plugin.session is None:
        plugin.overrides, plugin.worker_payload = dict(attached[0]), attached[1]
    # this session's list only: a later start() without one goes back to attach()'s
    overrides = plugin.overrides if tracking is None else {**plugin.overrides, "tracking": list(tracking)}
    session = plugin.start_session(overrides)
    try:
        worker_plugin = MetricsWorkerPlugin(overrides, plugin.worker_payload, session)
        await _dask.add_worker_plugin(dask_scheduler, worker_plugin, WORKER_PLUGIN)
    except Exception:
        plugin.stop_session()
        raise
    deadline = time.monotonic() + REPORT_TIMEOUT
    # sampling has begun on every worker when start() returns: each reports where its samples go once sampled
    while not set(dask_scheduler.workers) <= set(plugin.destinations) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # the reports travel on the workers' batched streams
    for who, where in sorted(plugin.destinations.items()):
        user_log.info("influx-metrics session %s: %s sends to %s", session["id"], who, describe(where))
    return {**session, "destinations": {w: dict(d) for w, d in plugin.destinations.items()}}


def describe(where: dict) -> str:
    """One line for a destinations record.

    >>> describe({"sinks": ["udp"], "telegraf": "t:8094", "influxdb": None, "spool": None})
    'udp -> t:8094'
    """
    parts = []
    for sink in where["sinks"]:
        target = {
            "udp": where.get("telegraf"),
            "http": (where.get("influxdb") or {}).get("url"),
            "spool": where.get("spool"),
        }[sink]
        parts.append(f"{sink} -> {target}")
    return ", ".join(parts)


async def stop(dask_scheduler, missing_ok: bool = False) -> dict | None:
    """Tear sampling down on every worker (flushing their sinks), then end the session.

    Returns the ended session (None if the workers sampled with no session on
    record). Raises ``RuntimeError`` when nothing was running, unless ``missing_ok``.
    """
    had_workers = await _dask.remove_worker_plugin(dask_scheduler, WORKER_PLUGIN)
    plugin = dask_scheduler.plugins.get(JOBS_PLUGIN)
    session, close = plugin.end_session() if plugin is not None else (None, None)
    if close is not None:
        await off_loop(close)  # the scheduler's loop serves the work meanwhile
    if session is None and not had_workers and not missing_ok:
        raise RuntimeError(f"no monitoring session is running on {dask_scheduler.address}")
    return session
