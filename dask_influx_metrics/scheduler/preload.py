"""Dask ``--preload`` module: monitor a cluster from boot, with no client code.

::

    dask scheduler --preload dask_influx_metrics.preload
    dask worker tcp://scheduler:8786            # --preload here is optional

On the **scheduler**, :func:`dask_setup` installs the :class:`JobPlugin`
(jobs/DAGs, ``dag`` points) and starts a session the way ``Monitor.start()``
does (:func:`.session.start`): the :class:`MetricsWorkerPlugin` is registered
on the scheduler under its stable name, so every worker, present or future,
is sampled from when it connects (its host's agent, started by the first worker
of the host, samples ~0.1 s later; the worker's start does not wait for it).
All settings come from the
``influx-metrics`` Dask config, i.e. from environment variables such as
``DASK_INFLUX_METRICS__SINK=udp``: the scheduler's own environment for its
``dag`` points, and each worker's own environment for its samples (its
Telegraf address, GPU source, tags).

On a **worker** (or nanny) the preload does nothing: the plugin arrives from
the scheduler. Loading it there is harmless, so one command line can serve both.

A client can still take over later: ``Monitor(client).stop()`` ends the boot
session, ``attach()``/``start()`` begin a new one.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from distributed import Scheduler

from ..config import Settings
from ..names import EVENT_TOPIC, JOBS_PLUGIN, PRELOAD
from ..notices import Reporter
from . import session as _session
from .plugin import JobPlugin

logger = logging.getLogger(__name__)


async def dask_setup(server) -> None:
    """Called by Dask with the scheduler, worker or nanny being started."""
    if not isinstance(server, Scheduler):
        logger.info(
            "influx-metrics preload on %s: nothing to do (plugins come from the scheduler)", type(server).__name__
        )
        return
    try:
        await start_monitoring(server)
    except Exception as e:  # Dask logs "Failed to start preload" in the scheduler's log only: say it where clients look
        report = Reporter(functools.partial(server.log_event, EVENT_TOPIC), worker="scheduler")
        report(PRELOAD, f"monitoring did not start from --preload: {type(e).__name__}: {e}")
        raise


async def start_monitoring(scheduler, overrides: dict | None = None) -> dict:
    """Install the plugins on ``scheduler`` and start a session; return the session.

    ``overrides`` (config keys below ``influx-metrics``) default to none: the
    environment decides. Raises ``ValueError`` for invalid settings before
    installing anything (Dask logs "Failed to start preload" with the reason
    and the scheduler runs unmonitored; :func:`dask_setup` also reports it on the
    ``influx-metrics`` event topic: ``client.get_events("influx-metrics")``).
    """
    overrides = dict(overrides or {})
    settings = Settings.resolve(overrides)  # validate now, on the scheduler
    if "udp" in settings.sinks:  # a DNS lookup: off the event loop (the only sink that needs one)
        await asyncio.to_thread(settings.check_telegraf_host)
    # The scheduler calls the plugin's start(scheduler) itself right after preloads.
    scheduler.add_plugin(JobPlugin(overrides, worker_payload=b""), name=JOBS_PLUGIN)
    session = await _session.start(scheduler)
    _session.user_log.info("influx-metrics: session %s started from preload", session["id"])
    return session
