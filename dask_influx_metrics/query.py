from .client.query import QueryError, Store, connect, to_ns  # noqa: F401  public path: from dask_influx_metrics import query
