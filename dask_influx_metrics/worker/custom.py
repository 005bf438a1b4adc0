"""User-defined metrics: ``@custom_metric(name, per_device=True)``.

A per-device metric (the default, ``per_device=True``) is called as
``fn(worker, handle)`` once per GPU (the NVML handle, or the simulated device);
a per-worker metric (``per_device=False``) as ``fn(worker)`` once per sample
(``fn(worker, handles)``, with every device's handle, is accepted too). The
signature is checked when decorated and at ``attach``. Names are checked too:
one that reads back as a built-in metric, a table column or something else is
refused. Each must return a real number (not a bool, not text). Values land in the ``custom`` measurement, one float field per metric
name; per-device ones carry the device tags. Each metric runs on a thread of
its own with a deadline per sample (half the polling interval): one that
raises, returns something else, or overruns is reported once (log and the
worker's ``influx-metrics`` event topic, with its name) and skipped for that
sample (the scheduler keeps the first failure of each metric, which readers
name); the built-in metrics, the sampler and the worker carry on, and a hung
metric never holds up ``stop()``.

Example
-------
>>> @custom_metric("power-usage", per_device=True)
... def power_usage(worker, handle):
...     return 42.0
>>> power_usage.name, power_usage.per_device, power_usage(None, None)
('power-usage', True, 42.0)
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
import threading
import time
from typing import Callable

from .. import schema
from ..names import CUSTOM_METRIC
from ..notices import Reporter, clip
from ..schema import CUSTOM, Reading


class CustomMetric:
    """A function marked by :func:`custom_metric`; still callable as before."""

    def __init__(self, fn: Callable, name: str, per_device: bool):
        self.fn, self.name, self.per_device = fn, name, per_device
        self.takes_handles = _takes_handles(fn, name, per_device)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def sample(self, worker, arg):
        """One call as the sampler makes it: ``arg`` is the device handle (per device) or every
        device's handles (per worker, passed only to a function that takes them)."""
        return self.fn(worker, arg) if self.takes_handles else self.fn(worker)

    def __repr__(self) -> str:
        return f"custom_metric({self.name!r}, per_device={self.per_device})"


SIGNATURES = (
    "the accepted forms: @custom_metric(name) (per_device=True, the default) calls fn(worker, handle) "
    "once per GPU; @custom_metric(name, per_device=False) calls fn(worker) once per sample "
    "(fn(worker, handles) also works)"
)


def _takes_handles(fn: Callable, name: str, per_device: bool) -> bool:
    """Whether ``fn`` gets the second argument; TypeError when it fits neither form of ``per_device``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: called with both arguments, as always
        return True

    def fits(*args) -> bool:
        try:
            signature.bind(*args)
            return True
        except TypeError:
            return False

    if fits(None, None):
        return True
    if not per_device and fits(None):
        return False
    called = "fn(worker, handle) once per GPU" if per_device else "fn(worker) once per sample"
    raise TypeError(
        f"custom metric {name!r} is per_device={per_device}{' (the default)' if per_device else ''}, "
        f"so it is called as {called}, but {getattr(fn, '__name__', fn)}{signature} cannot take that; "
        f"{SIGNATURES}"
    )


# Names a table, the CSV or the readers give another meaning: base and task columns, InfluxQL's time.
_COLUMNS = frozenset({"job", "dag", "timestamp", "time", "worker", "tasks", "running"})
# A per-GPU column is ``name[i]``: a name that ends like one reads back as a GPU of another metric.
_DEVICE_SUFFIX = re.compile(r"\[\d+\]$")


def check_name(name) -> str:
    """``name`` if it reads back as this custom metric and nothing else; ValueError naming why not.

    >>> check_name("compute-util")
    Traceback (most recent call last):
    ...
    ValueError: custom metric name 'compute-util' is a built-in metric name; reads would return the built-in's values. Choose another name
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"custom_metric name must be a non-empty string, got {name!r}")
    if schema.tag_field_collisions(custom_fields=[name]):
        raise ValueError(
            f"custom_metric name {name!r} is a tag name of the custom measurement "
            f"{schema.MEASUREMENT_TAGS[schema.CUSTOM]}; InfluxDB 3 refuses a field named like a tag"
        )
    bad = sorted({c for c in name if ord(c) < 0x20 or ord(c) == 0x7F})
    measurement = name.split(".", 1)[0] if "." in name else None
    problem = (
        "is a built-in metric name; reads would return the built-in's values"
        if name in schema.TRACKING
        else f"reads as the field {name!r} of the {measurement!r} measurement ('measurement.field' names a "
        "built-in field)"
        if measurement in schema.MEASUREMENT_TAGS
        else "is a column of every table and CSV file"
        if name in _COLUMNS
        else f"contains control character(s) {', '.join(repr(c) for c in bad)}, stored as spaces"
        if bad
        else "contains a backslash, which line protocol does not store exactly"
        if "\\" in name
        else "ends like a per-GPU column ('name[0]'), so tables and CSV files would read it as a GPU of another metric"
        if _DEVICE_SUFFIX.search(name)
        else "has leading or trailing spaces, which CSV readers strip"
        if name != name.strip()
        else None
    )
    if problem:
        raise ValueError(f"custom metric name {name!r} {problem}. Choose another name")
    return name


def custom_metric(name: str, per_device: bool = True):
    """Mark ``fn`` as a custom metric called ``name``: ``fn(worker, handle)`` per GPU (the default),
    or with ``per_device=False`` ``fn(worker)`` once per sample.

    >>> @custom_metric("queue-depth", per_device=False)
    ... def depth(worker):
    ...     return 3
    >>> depth
    custom_metric('queue-depth', per_device=False)
    """
    check_name(name)

    def mark(fn):
        if not callable(fn):
            raise TypeError(f"@custom_metric({name!r}) must decorate a function, got {fn!r}")
        return CustomMetric(fn, name, bool(per_device))

    return mark


def validate(metrics) -> list[CustomMetric]:
    """Check a ``custom_metrics=[...]`` list (``attach``): names and signatures again (an object may
    have changed since it was decorated); raise naming the bad entry."""
    metrics = list(metrics or [])
    seen = set()
    for m in metrics:
        if not isinstance(m, CustomMetric):
            raise TypeError(
                f"custom metric {getattr(m, '__name__', m)!r} is not decorated; "
                "wrap it with @custom_metric(name, per_device=...)"
            )
        check_name(m.name)
        m.takes_handles = _takes_handles(m.fn, m.name, m.per_device)
        if m.name in seen:
            raise ValueError(f"two custom metrics are called {m.name!r}")
        seen.add(m.name)
    return metrics


class CustomSource:
    """Runs custom metrics each sample; ``devices()`` gives (tags, handle) pairs.

    Each metric runs on a thread of its own (:class:`_Runner`); ``read`` waits
    for all of them until ``timeout`` s after it posted their calls, so a slow
    or hung metric costs a sample at most that once and is then skipped, while
    its call is still running. ``stop()`` never waits for a call in progress.
    """

    def __init__(
        self, metrics, worker, devices: Callable[[], list], report: Reporter | None = None, timeout: float = 0.1
    ):
        self._metrics = list(metrics)
        self._worker = worker
        self._devices = devices
        self._report = report or Reporter()  # the worker's: one log line and one session event per problem
        self.timeout = float(timeout)
        self._runners: dict[str, _Runner] = {}

    def read(self) -> list[Reading]:
        if not self._metrics:
            return []
        devices = self._devices()
        handles = [h for _, h in devices]
        posted = []
        for m in self._metrics:
            runner = self._runner(m)
            calls = [(tags, h) for tags, h in devices] if m.per_device else [({}, handles)]
            if runner is not None and runner.post(calls):
                posted.append(runner)
        deadline = time.monotonic() + self.timeout
        per_tags: dict[tuple, dict] = {}
        for runner in posted:
            results = runner.result(deadline)
            if results is None:
                self._report_once(
                    runner.metric.name,
                    "overran",
                    f"custom metric {runner.metric.name!r} took longer than {self.timeout:g} s; skipped while it runs",
                )
                continue
            for tags, value in results:
                value = self._check(runner.metric, value)
                if value is not None:
                    per_tags.setdefault(tuple(sorted(tags.items())), {})[runner.metric.name] = value
        return [Reading(CUSTOM, dict(t), f) for t, f in per_tags.items()]

    def stop(self) -> None:
        """Let each metric's thread end; one still in a call ends when the call returns."""
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()

    def _runner(self, metric: CustomMetric):
        """This metric's runner, or None while one of an earlier source is still in a call."""
        runner = self._runners.get(metric.name)
        if runner is None:
            key = (id(self._worker), metric.name)
            if key in _Runner.stragglers:
                self._report_once(
                    metric.name,
                    "overran",
                    f"custom metric {metric.name!r} is still running from an earlier session; skipped until it returns",
                )
                return None
            runner = self._runners[metric.name] = _Runner(metric, self._worker, key)
        return runner

    def _check(self, metric: CustomMetric, value):
        """``value`` as a finite float, or None (reported once) for an exception or a non-number."""
        try:
            if isinstance(value, Exception):
                raise value
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"returned {type(value).__name__} {clip(repr(value), 100)}, not a number")
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"returned {value}")
            return value
        except Exception as e:  # user code: report once, never kill the sampler
            self._report_once(
                metric.name, "failed", f"custom metric {metric.name!r} failed: {type(e).__name__}: {clip(e)}"
            )
            return None

    def _report_once(self, name: str, kind: str, message: str) -> None:
        """Said once per metric and kind of problem (the scheduler keeps the first of each metric)."""
        self._report.once(CUSTOM_METRIC, message, key=(CUSTOM_METRIC, name, kind), metric=name, problem=kind)


class _Runner:
    """One custom metric's thread: runs one sample's calls at a time; ``busy`` until they return."""

    stragglers: set = set()  # (worker id, name) of stopped runners still in a call
    _lock = threading.Lock()

    def __init__(self, metric: CustomMetric, worker, key: tuple):
        self.metric, self._worker, self._key = metric, worker, key
        self._cond = threading.Condition()
        self._calls = self._results = None
        self.busy = self._closed = False
        threading.Thread(target=self._run, name=f"influx-metrics-custom-{metric.name}", daemon=True).start()

    def post(self, calls: list) -> bool:
        """Start ``calls`` ((tags, arg) pairs) unless the previous ones still run."""
        with self._cond:
            if self.busy:
                return False
            self.busy, self._calls, self._results = True, calls, None
            self._cond.notify_all()
            return True

    def result(self, deadline: float) -> list | None:
        """[(tags, value or exception)] once done, or None if still running at ``deadline`` (monotonic)."""
        with self._cond:
            while self.busy and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return None if self.busy else self._results

    def close(self) -> None:
        with self._cond:
            self._closed = True
            if self.busy:
                with _Runner._lock:
                    _Runner.stragglers.add(self._key)
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._calls is None and not self._closed:
                    self._cond.wait()
                if self._calls is None:
                    return
                calls, self._calls = self._calls, None
            results = []
            for tags, arg in calls:
                try:
                    results.append((tags, self.metric.sample(self._worker, arg)))
                except Exception as e:
                    results.append((tags, e))
            with self._cond:
                self._results, self.busy = results, False
                self._cond.notify_all()
                if self._closed:
                    with _Runner._lock:
                        _Runner.stragglers.discard(self._key)
