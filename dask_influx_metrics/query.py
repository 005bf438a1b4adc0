"""Public import path: ``from dask_influx_metrics import query`` (lives in :mod:`.client.query`)."""

from .client.query import QueryError, Store, connect, to_ns  # noqa: F401

__all__ = ["connect", "Store", "QueryError", "to_ns"]
