"""Public import path: ``from dask_influx_metrics import visualize`` (lives in :mod:`.client.visualize`)."""

from .client.visualize import boxes, lines  # noqa: F401

__all__ = ["lines", "boxes"]
