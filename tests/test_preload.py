"""``dask scheduler --preload dask_influx_metrics.preload``: monitored from boot.

Real ``dask scheduler``/``dask worker`` processes on 127.0.0.1, settings only
from the environment, points read back from the private influxd.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from distributed import Client

from dask_influx_metrics import Monitor
from dask_influx_metrics.names import DASHBOARD_PAGE

DASK = os.path.join(os.path.dirname(sys.executable), "dask")


def _env(influxd, run: str) -> dict:
    host, port = influxd.udp_address
    return {
        **os.environ,
        "DASK_INFLUX_METRICS__SINK": "udp",
        "DASK_INFLUX_METRICS__TELEGRAF__ADDRESS": f"{host}:{port}",
        "DASK_INFLUX_METRICS__GPU__SOURCE": "simulated",
        "DASK_INFLUX_METRICS__TAGS": json.dumps({"run": run}),
    }


def _spawn(args, env, log):
    return subprocess.Popen(
        [DASK, *args], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )


def _stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _wait_file(path, proc, log_path, timeout=30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(log_path) as f:
                pytest.fail(f"scheduler did not write {path} (rc={proc.poll()}):\n{f.read()[-3000:]}")
        time.sleep(0.05)


def wait_until_value(fn, timeout: float, what: str):
    """``fn()`` once it is truthy (``AssertionError`` naming ``what`` after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.1)
    return value


def test_preload_monitors_cluster_from_boot(influxd, tmp_path):
    run = uuid.uuid4().hex
    env = _env(influxd, run)
    scheduler_file = str(tmp_path / "scheduler.json")
    logs = {name: tmp_path / f"{name}.log" for name in ("scheduler", "worker")}
    procs = []
    try:
        with open(logs["scheduler"], "w") as log:
            procs.append(
                _spawn(
                    [
                        "scheduler",
                        "--preload",
                        "dask_influx_metrics.preload",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        "0",
                        "--dashboard-address",
                        "127.0.0.1:0",  # a free port: never the busy 8787
                        "--scheduler-file",
                        scheduler_file,
                    ],
                    env,
                    log,
                )
            )
        _wait_file(scheduler_file, procs[0], logs["scheduler"])
        with open(logs["worker"], "w") as log:
            procs.append(
                _spawn(
                    [
                        "worker",
                        "--scheduler-file",
                        scheduler_file,
                        "--host",
                        "127.0.0.1",
                        "--nthreads",
                        "2",
                        "--no-dashboard",
                    ],
                    env,
                    log,
                )
            )
        with Client(scheduler_file=scheduler_file, timeout=30) as client:
            client.wait_for_workers(1, timeout=30)
            # long enough for the agent to sample them: the worker's start does not wait for the agent
            futures = client.map(lambda x: time.sleep(1.0) or x * 2, range(6))
            # the dashboard's GPU Jobs page, fed by the worker's heartbeats while the tasks run
            live = wait_until_value(lambda: [r for r in Monitor(client).live() if r["util"]], 30, "live figures")
            assert live[0]["job"] == 1 and live[0]["gpus"] == 1, live
            assert sum(client.gather(futures)) == 30
            worker = next(iter(client.scheduler_info()["workers"]))
            port = client.scheduler_info()["services"]["dashboard"]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/individual-plots.json", timeout=30) as r:
                assert DASHBOARD_PAGE in json.load(r).values()

        where = f"WHERE \"run\" = '{run}'"
        gpu = influxd.wait_for(f'SELECT * FROM "gpu" {where} AND "worker" = \'{worker}\'', 1, timeout=30)
        assert gpu[0]["uuid"].startswith("SIM-")
        busy = influxd.wait_for(f'SELECT "tasks" FROM "worker" {where} AND "dag" != \'0\'', 1, timeout=30)
        assert all(row["tasks"] >= 1 for row in busy)
        dags = influxd.wait_for(f'SELECT "event" FROM "dag" {where}', 2, timeout=30)
        assert {row["event"] for row in dags} == {"submit", "end"}
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_preload_refuses_an_unresolvable_telegraf_host_before_installing_anything():
    import asyncio

    from distributed import Scheduler

    from dask_influx_metrics.names import JOBS_PLUGIN, WORKER_PLUGIN
    from dask_influx_metrics.scheduler.preload import start_monitoring

    async def attempt():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as scheduler:
            with pytest.raises(ValueError, match="telegraf.address names a host that does not resolve"):
                await start_monitoring(scheduler, {"sink": "udp", "telegraf.address": "x" * 64 + ".invalid:8094"})
            return JOBS_PLUGIN in scheduler.plugins or WORKER_PLUGIN in scheduler.worker_plugins

    assert not asyncio.run(attempt())


def _preloaded(tmp_path, **settings) -> dict:
    """dask.config for an in-process scheduler with the preload, spooling into ``tmp_path``."""
    return {
        "distributed.scheduler.preload": ["dask_influx_metrics.preload"],
        "influx-metrics": {"sink": "spool", "spool": {"directory": str(tmp_path)}, **settings},
    }


def _threads() -> set:
    import threading

    return {t.name for t in threading.enumerate() if t.name.startswith("influx")}


def test_a_scheduler_started_after_a_dask_config_reset_is_monitored(tmp_path):
    """Issue 48: distributed's test suite puts back a copy of dask.config taken before this package was
    imported (our defaults gone) after every test; every later scheduler must still be monitored."""
    import asyncio

    import dask
    from distributed import Scheduler

    from dask_influx_metrics.names import JOBS_PLUGIN

    async def attempt():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as scheduler:
            plugin = scheduler.plugins.get(JOBS_PLUGIN)
            return plugin is not None and plugin.session is not None

    saved = dask.config.config.copy()
    try:
        dask.config.config.pop("influx-metrics", None)
        with dask.config.set({"distributed.scheduler.preload": ["dask_influx_metrics.preload"]}):
            dask.config.set({"influx-metrics.spool.directory": str(tmp_path)})  # and nothing else of ours
            assert asyncio.run(attempt())
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def test_a_preload_that_cannot_start_says_so_where_a_client_looks(tmp_path):
    """Not only "Failed to start preload" in the scheduler's log: an event on the influx-metrics topic."""
    import asyncio

    import dask
    from distributed import Client, Scheduler

    from dask_influx_metrics.names import EVENT_TOPIC, JOBS_PLUGIN, PRELOAD

    async def attempt():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as scheduler:
            async with Client(scheduler.address, asynchronous=True) as client:
                events = await client.get_events(EVENT_TOPIC)
            return JOBS_PLUGIN in scheduler.plugins, [e for _, e in events]

    with dask.config.set(_preloaded(tmp_path, **{"polling-interval": 0})):
        installed, events = asyncio.run(attempt())
    assert not installed
    (event,) = [e for e in events if e.get("what") == PRELOAD]
    assert "polling-interval must be a number of ms from 1" in event["message"], event
    assert event["message"].startswith("monitoring did not start from --preload")


def test_a_scheduler_stopped_and_never_closed_leaves_no_thread_of_ours(tmp_path):
    """distributed's test_nanny.py::test_scheduler_file ends a scheduler with stop() alone: the session's
    threads (delivery health, the spool's flush timer) end with it, its last counts on disk."""
    import asyncio

    import dask
    from distributed import Client, Scheduler

    async def until(predicate, what):
        deadline = time.monotonic() + 10
        while not predicate():
            assert time.monotonic() < deadline, f"{what}: not in 10 s"
            await asyncio.sleep(0.01)

    async def attempt():
        before = _threads()
        scheduler = await Scheduler(host="127.0.0.1", port=0, dashboard_address=":0")
        try:
            async with Client(scheduler.address, asynchronous=True) as client:
                future = client.submit(sum, [1, 2], pure=False)  # no worker: it waits; a DAG point, the timer
                await until(lambda: "influx-spool-flush" in _threads() - before, "the spool's flush timer")
                del future
            assert "influx-delivery-health" in _threads() - before
            scheduler.stop()
            await until(lambda: not (_threads() - before), "our threads ended with stop()")
        finally:
            await scheduler.close()

    with dask.config.set(_preloaded(tmp_path)):
        asyncio.run(attempt())
    (session,) = os.listdir(tmp_path)
    lines = b"".join(p.read_bytes() for p in (tmp_path / session / "scheduler").iterdir())
    assert b"delivery," in lines and b"dag," in lines, lines[:500]
