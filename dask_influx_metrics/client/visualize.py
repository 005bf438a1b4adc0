"""Plots of one worker's metrics during one job: line charts and box plots.

Both functions take a per-worker table (see docs/analysis.md, "Tables": a
``time``-indexed DataFrame with ``job``, ``dag``, ``timestamp`` and metric
columns such as ``compute-util[0]``) or the path of a CSV file in the old
dask-metrics layout, and return a :class:`matplotlib.figure.Figure`. They use
no pyplot state, so they work headless and leak no figures; pass ``save=`` to
write the figure (the format follows the file extension).

A job's plot shows the samples that count for it: busy (``dag != "0"``) with
the job in the ``job`` tag; samples in which the worker was idle, which carry
its last job, are left out. Byte and MiB quantities (``total-mem``,
``worker-gpu-mem``, ``gpu.memory_used``, ...) are drawn in GiB. Percentages
are drawn on 0-100 and other quantities that are never negative from 0, so
noise in a narrow band does not look like a swing.

matplotlib is optional: ``pip install dask-influx-metrics[plot]``.

Example
-------
>>> import pandas as pd
>>> table = pd.DataFrame({"job": ["1", "1,2", "2", "2"], "dag": ["1", "1,2", "2", "0"],
...                       "timestamp": [0.0, 0.5, 1.0, 1.5],
...                       "compute-util[0]": [10.0, 50.0, 90.0, 0.0]})
>>> fig = lines(table, 2, ["compute-util"])
>>> fig.axes[0].lines[0].get_xdata().tolist()   # the idle last sample is not job 2's
[0.5, 1.0]
>>> fig.axes[0].get_title()
'compute-util (%)'
"""

from __future__ import annotations

import os
import re

from .. import jobtags, schema
from .query.metricnames import BYTES_METRICS
from .summary import interval_seconds

__all__ = ["lines", "boxes", "unit_of", "DEFAULT_METRICS"]

DEFAULT_METRICS = ("compute-util", "mem-util")
XLABEL = "seconds since start"
# Columns of the table that are not metrics.
_NOT_METRICS = frozenset({"job", "dag", "timestamp", "running"})
# Tracking names whose table unit is not the unit of their single schema field.
_UNIT_OVERRIDES = {**{m: "bytes" for m in BYTES_METRICS}, "tasks": "count"}
# Units drawn in GiB instead, and the divisor that gets there.
_GIB = {"bytes": float(2**30), "MiB": float(2**10)}
BUSY_SHADE = {"color": "tab:green", "alpha": 0.12, "linewidth": 0}
# Each line of a subplot gets its own dash and marker, markers offset per line, so equal lines
# (two idle GPUs) stay distinguishable instead of hiding each other.
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MARKS_PER_LINE = 12
_DEVICE_COLUMN = re.compile(r"^(?P<metric>.+)\[(?P<index>\d+)\]$")


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "dask_influx_metrics.visualize needs matplotlib; install it with `pip install dask-influx-metrics[plot]`"
        ) from error
    return Figure


def unit_of(metric: str, attrs: dict | None = None) -> str:
    """The unit of a metric column group: from ``attrs["units"]`` if given, else derived.

    >>> unit_of("total-mem"), unit_of("compute-util"), unit_of("gpu.power_draw")
    ('bytes', '%', 'W')
    >>> unit_of("my-custom-metric"), unit_of("power", {"units": {"power": "kW"}})
    ('', 'kW')
    """
    units = (attrs or {}).get("units") or {}
    if metric in units:
        return str(units[metric])
    if metric in _UNIT_OVERRIDES:
        return _UNIT_OVERRIDES[metric]
    fields = schema.TRACKING.get(metric)
    if fields is not None and len(fields) == 1:
        return schema.FIELDS[fields[0]].unit
    measurement, dot, field = metric.partition(".")
    if dot and (measurement, field) in schema.FIELDS:
        return schema.FIELDS[measurement, field].unit
    return ""


def _metric_columns(table) -> dict[str, list[tuple[str, str]]]:
    """``{metric: [(legend label, column), ...]}`` in table order, GPUs by index."""
    found: dict[str, list[tuple[int, str]]] = {}
    for column in table.columns:
        column = str(column)
        if column in _NOT_METRICS:
            continue
        match = _DEVICE_COLUMN.match(column)
        if match:
            found.setdefault(match["metric"], []).append((int(match["index"]), column))
        else:
            found.setdefault(column, []).append((-1, column))
    return {
        metric: [(f"GPU {i}" if i >= 0 else metric, col) for i, col in sorted(cols)] for metric, cols in found.items()
    }


def _select(source, job, metrics):
    """Load ``source`` and return (name, job, rows, runs, step, panels).

    ``rows`` are the samples that count for ``job``, by timestamp; ``runs``
    numbers each row's busy interval (consecutive samples of the job in the
    whole table); ``step`` is the sampling interval (s). ``panels`` is a list
    of ``(metric, unit, divisor, [(label, column), ...])``.
    """
    import pandas as pd

    if isinstance(source, (str, os.PathLike)):
        from .csvfiles import read_worker_csv

        table = read_worker_csv(source)
        name = table.attrs.get("worker") or os.path.basename(os.fspath(source))
    elif isinstance(source, pd.DataFrame):
        table = source
        name = table.attrs.get("worker") or "worker"
    else:
        raise TypeError(f"source must be a CSV path or a DataFrame, not {type(source).__name__}")
    for column in ("job", "dag", "timestamp"):
        if column not in table.columns:
            raise ValueError(f"{name}: the table has no {column!r} column")
    if table.empty:
        raise ValueError(f"{name}: the table has no samples")

    table = table.sort_values("timestamp", kind="stable")
    present = jobtags.distinct(table.loc[jobtags.counting(table), "job"].unique())
    number = int(str(job).strip()) if str(job).strip().isdecimal() else None  # 2 or "2"
    if number not in present:
        raise ValueError(f"job {job!r} not in {name}; jobs present: {', '.join(map(str, present))}")
    mask = jobtags.counts_for(table, number)
    runs = (mask != mask.shift()).cumsum()[mask].to_numpy()
    rows = table[mask.to_numpy()]

    available = _metric_columns(table)
    if metrics is None:
        metrics = [m for m in DEFAULT_METRICS if m in available]
        if not metrics:
            raise ValueError(
                f"none of the default metrics {list(DEFAULT_METRICS)} is in {name}; "
                f"pass metrics=[...] from: {', '.join(available) or '(none)'}"
            )
    elif isinstance(metrics, str):
        metrics = [metrics]
    metrics = list(metrics)
    if not metrics:
        raise ValueError("metrics is empty: name at least one metric to plot")
    missing = [m for m in metrics if m not in available]
    if missing:
        raise ValueError(f"metric(s) {missing} not in {name}; metrics present: {', '.join(available) or '(none)'}")
    if rows.empty:  # pragma: no cover - a present job always has rows
        raise ValueError(f"{name}: no samples for job {job!r}")
    panels = []
    for m in metrics:
        unit = unit_of(m, table.attrs)
        panels.append((m, "GiB" if unit in _GIB else unit, _GIB.get(unit, 1.0), available[m]))
    return name, str(number), rows, runs, interval_seconds(table), panels


def _plot(source, job, metrics, width, height, save, draw):
    """Shared frame: one subplot per metric, ``draw(ax, x, values, labels, runs, step)`` fills one."""
    import numpy as np
    import pandas as pd

    name, key, rows, runs, step, panels = _select(source, job, metrics)
    x = pd.to_numeric(rows["timestamp"], errors="coerce").to_numpy(dtype=float)
    fig = _figure_class()(figsize=(width, height), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (metric, unit, divisor, columns) in zip(axes, panels):
        values = (
            np.column_stack([pd.to_numeric(rows[col], errors="coerce").to_numpy(dtype=float) for _, col in columns])
            / divisor
        )
        draw(ax, x, values, [label for label, _ in columns], runs, step)
        _y_limits(ax, unit, values)
        ax.set_title(f"{metric} ({unit})" if unit else metric)
        ax.set_ylabel(unit or metric)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel(XLABEL)
    fig.suptitle(f"{name} - job {key}")
    if save is not None:
        fig.savefig(save, bbox_inches="tight")
    return fig


def _y_limits(ax, unit: str, values) -> None:
    """Percentages on 0-100 (more if a value is above, e.g. several cores), other quantities that
    are never negative from 0: noise in a narrow band must not look like a swing."""
    import numpy as np

    finite = values[np.isfinite(values)]
    if unit == "%":
        top = float(finite.max()) if finite.size else 0.0
        ax.set_ylim(0, 100.0 if top <= 100 else top * 1.05)
    elif finite.size and finite.min() >= 0:
        ax.set_ylim(bottom=0)


def lines(source, job, metrics=None, width=20, height=10, save=None):
    """Line chart of a worker's metrics during one job: one subplot per metric.

    ``source`` is a per-worker table or the path of an old-layout CSV file;
    ``job`` a job number (a busy sample belongs to every job in its ``job``
    list; idle samples to none); ``metrics`` metric names (default: those of
    ``compute-util`` and ``mem-util`` that the table has). Each GPU is one line
    ("GPU 0", ...); x is the job's own ``timestamp`` values (seconds since
    collection start). The job's busy intervals are shaded (each sample
    +- half a sampling interval) and lines break between them, so no line
    crosses time in which the job ran nothing on this worker. Each line has
    its own dash and markers (offset per line), so equal lines stay visible.
    ``width``/``height`` are in inches; ``save`` is a file name to write.
    Returns the :class:`~matplotlib.figure.Figure`. Raises ``ValueError`` for a
    job or metric not in the table.

    >>> fig = lines("worker-0.csv", 2, ["compute-util", "power"], save="job2.png")  # doctest: +SKIP
    """

    def draw(ax, x, values, labels, runs, step):
        import numpy as np

        for run in np.unique(runs):
            ax.axvspan(x[runs == run].min() - step / 2, x[runs == run].max() + step / 2, **BUSY_SHADE)
        cut = np.flatnonzero(np.diff(runs)) + 1  # a NaN between busy intervals breaks the lines
        x, values = np.insert(x, cut, np.nan), np.insert(values, cut, np.nan, axis=0)
        stride = max(len(labels), len(x) // MARKS_PER_LINE)  # line k marks samples k*stride/n + j*stride
        for k, label in enumerate(labels):
            ax.plot(
                x,
                values[:, k],
                label=label,
                linestyle=LINESTYLES[k % len(LINESTYLES)],
                marker=MARKERS[k % len(MARKERS)],
                markersize=4,
                markevery=(k * stride // len(labels), stride),
            )
        if labels[0].startswith("GPU "):
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))

    return _plot(source, job, metrics, width, height, save, draw)


def boxes(source, job, metrics=None, freq=15, width=20, height=10, save=None):
    """Box plots of a worker's metrics during one job: one subplot per metric.

    Each box pools the values of all GPUs over ``freq`` consecutive samples
    that count for the job (the last box may hold fewer); its tick label is the
    timestamp of its first sample, in seconds since start, to 0.1 s. Other
    arguments and errors as for :func:`lines`; ``freq < 1`` raises
    ``ValueError``.

    >>> fig = boxes("worker-0.csv", 1, ["compute-util"], freq=10, save="job1-boxes.png")  # doctest: +SKIP
    """
    if not isinstance(freq, int) or isinstance(freq, bool) or freq < 1:
        raise ValueError(f"freq must be a positive integer (samples per box), not {freq!r}")

    def draw(ax, x, values, labels, runs, step):
        import numpy as np

        starts = range(0, len(x), freq)
        pooled = [values[s : s + freq].ravel() for s in starts]
        pooled = [chunk[~np.isnan(chunk)] for chunk in pooled]
        # manage_ticks would append to the ticks the shared x axis already has
        ax.boxplot(pooled, manage_ticks=False)
        ax.set_xticks(range(1, len(pooled) + 1), [f"{x[s]:.1f}" for s in starts])
        ax.set_xlim(0.5, len(pooled) + 0.5)
        if len(pooled) > 20:
            ax.tick_params(axis="x", labelrotation=90)

    return _plot(source, job, metrics, width, height, save, draw)
