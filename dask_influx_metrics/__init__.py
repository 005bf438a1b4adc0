"""dask-influx-metrics: what every GPU did, per Dask job and DAG, in InfluxDB.

>>> from dask_influx_metrics import Monitor, custom_metric
"""

import os as _os

from . import config as _config

if _os.environ.get(_config.AGENT_ENV) is None:  # the host agent reads no Dask config, and starts without Dask
    _config.register_defaults()  # dask.config answers for influx-metrics.*

__all__ = ["Monitor", "custom_metric"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``Monitor`` (it imports ``distributed``) and ``custom_metric``, imported on first use, so that a
    host agent (``python -m dask_influx_metrics.agent``) starts light."""
    if name == "Monitor":
        from .client.monitor import Monitor

        return Monitor
    if name == "custom_metric":
        from .worker.custom import custom_metric

        return custom_metric
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
