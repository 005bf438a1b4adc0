"""User-defined metrics: ``@custom_metric(name, per_device=True)``.

A per-device metric is called as ``fn(worker, handle)`` once per GPU (the NVML
handle, or the simulated device); a per-worker metric as ``fn(worker,
handles)`` once per sample. Each must return a number. Values land in the
``custom`` measurement, one float field per metric name; per-device ones carry
the device tags. A metric that raises is reported once (log and the worker's
``influx-metrics`` event topic, with its name) and skipped; the sampler and the
worker carry on.

Example
-------
>>> @custom_metric("power-usage", per_device=True)
... def power_usage(worker, handle):
...     return 42.0
>>> power_usage.name, power_usage.per_device, power_usage(None, None)
('power-usage', True, 42.0)
"""

from __future__ import annotations

import logging
import math
from typing import Callable

from ... import schema
from ...schema import CUSTOM, Reading

logger = logging.getLogger(__name__)


class CustomMetric:
    """A function marked by :func:`custom_metric`; still callable as before."""

    def __init__(self, fn: Callable, name: str, per_device: bool):
        self.fn, self.name, self.per_device = fn, name, per_device
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"custom_metric({self.name!r}, per_device={self.per_device})"


def custom_metric(name: str, per_device: bool = True):
    """Mark ``fn`` as a custom metric called ``name``.

    >>> @custom_metric("queue-depth", per_device=False)
    ... def depth(worker, handles):
    ...     return 3
    >>> depth
    custom_metric('queue-depth', per_device=False)
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"custom_metric name must be a non-empty string, got {name!r}")
    if schema.tag_field_collisions(custom_fields=[name]):
        raise ValueError(f"custom_metric name {name!r} is a tag name of the custom measurement "
                         f"{schema.MEASUREMENT_TAGS[schema.CUSTOM]}; InfluxDB 3 refuses a field named like a tag")

    def mark(fn):
        if not callable(fn):
            raise TypeError(f"@custom_metric({name!r}) must decorate a function, got {fn!r}")
        return CustomMetric(fn, name, bool(per_device))

    return mark


def validate(metrics) -> list[CustomMetric]:
    """Check a ``custom_metrics=[...]`` list; raise naming the bad entry."""
    metrics = list(metrics or [])
    seen = set()
    for m in metrics:
        if not isinstance(m, CustomMetric):
            raise TypeError(
                f"custom metric {getattr(m, '__name__', m)!r} is not decorated; "
                "wrap it with @custom_metric(name, per_device=...)"
            )
        if m.name in seen:
            raise ValueError(f"two custom metrics are called {m.name!r}")
        seen.add(m.name)
    return metrics


class CustomSource:
    """Runs custom metrics each sample; ``devices()`` gives (tags, handle) pairs."""

    def __init__(self, metrics, worker, devices: Callable[[], list], report: Callable[[str, str], None] | None = None):
        self._metrics = list(metrics)
        self._worker = worker
        self._devices = devices
        self._report = report or (lambda name, msg: None)
        self._failed: set[str] = set()

    def read(self) -> list[Reading]:
        if not self._metrics:
            return []
        devices = self._devices()
        handles = [h for _, h in devices]
        per_tags: dict[tuple, dict] = {}
        for m in self._metrics:
            calls = [(tags, h) for tags, h in devices] if m.per_device else [({}, handles)]
            for tags, arg in calls:
                value = self._call(m, arg)
                if value is not None:
                    per_tags.setdefault(tuple(sorted(tags.items())), {})[m.name] = value
        return [Reading(CUSTOM, dict(t), f) for t, f in per_tags.items()]

    def _call(self, metric: CustomMetric, arg):
        try:
            value = float(metric.fn(self._worker, arg))
            if not math.isfinite(value):
                raise ValueError(f"returned {value}")
            return value
        except Exception as e:  # user code: report once, never kill the sampler
            if metric.name not in self._failed:
                self._failed.add(metric.name)
                msg = f"custom metric {metric.name!r} failed: {type(e).__name__}: {e}"
                logger.warning(msg)
                self._report(metric.name, msg)
            return None
