"""dask-influx-metrics: what every GPU did, per Dask job and DAG, in InfluxDB.

>>> from dask_influx_metrics import Monitor, custom_metric
"""

from . import config as _config  # registers the influx-metrics defaults with dask.config
from .client.monitor import Monitor
from .worker.sources.custom import custom_metric

__all__ = ["Monitor", "custom_metric"]
__version__ = "0.1.0"
