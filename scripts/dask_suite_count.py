"""A second scheduler preload for ``scripts/dask_suite.py``: one line per scheduler started, in the file named
by ``DASK_SUITE_SCHEDULERS``: its address, the id of the monitoring session the monitor's preload started on it
(``-`` for none) and the test that started it. Dask runs each preload on its own, so a failing monitor does not
stop this count."""

import os


def dask_setup(scheduler) -> None:
    path = os.environ.get("DASK_SUITE_SCHEDULERS")
    if path:
        plugin = scheduler.plugins.get("influx-metrics-jobs")  # dask_influx_metrics.names.JOBS_PLUGIN
        session = (getattr(plugin, "session", None) or {}).get("id", "-")
        with open(path, "a") as f:
            test = os.environ.get("PYTEST_CURRENT_TEST", "-")  # "<test id> (setup)"
            f.write(f"{scheduler.address} {session} {test}\n")
