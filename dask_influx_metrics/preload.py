from .scheduler.preload import dask_setup, start_monitoring  # noqa: F401  dask scheduler --preload dask_influx_metrics.preload
