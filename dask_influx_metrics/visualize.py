from .client.visualize import boxes, lines  # noqa: F401  public path: from dask_influx_metrics import visualize
