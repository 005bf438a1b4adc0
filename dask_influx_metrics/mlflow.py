"""Public import path: ``from dask_influx_metrics.mlflow import log_summary`` (lives in :mod:`.client.mlflowlog`)."""

from .client.mlflowlog import GPU, REFERENCE, log_summary  # noqa: F401

__all__ = ["log_summary", "REFERENCE", "GPU"]
