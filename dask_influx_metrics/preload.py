"""Public ``--preload`` path: ``dask scheduler --preload dask_influx_metrics.preload``.

The code lives in :mod:`dask_influx_metrics.scheduler.preload`.
"""

from .scheduler.preload import dask_setup, start_monitoring  # noqa: F401

__all__ = ["dask_setup", "start_monitoring"]
