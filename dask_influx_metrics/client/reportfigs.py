"""The HTML report's figures: interactive Bokeh plots, embedded inline (no network to open them).

Bokeh is optional (``pip install dask-influx-metrics[report]``) and imported here only. Each
worker's samples go into one ``ColumnDataSource`` shared by every job's figures, so the file
holds them once.

>>> import pandas as pd
>>> t = pd.DataFrame({"job": ["1", "1", "1", "2", "1"], "dag": ["1", "1", "0", "2", "3"],
...                   "timestamp": [0.0, 0.5, 1.0, 1.5, 2.0]})
>>> busy_intervals(t, 1)
[(-0.25, 0.75), (1.75, 2.25)]
"""

from __future__ import annotations

import pandas as pd

from .. import jobtags
from .summary import interval_seconds
from .tables import device_columns
from .visualize import unit_of

EXTRA = "pip install dask-influx-metrics[report]"
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
BUSY_COLOR = "#2ca02c"
DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot")  # equal lines stay distinguishable
TOOLS = "pan,xwheel_zoom,box_zoom,reset,save"


def require_bokeh():
    """Import Bokeh, or raise an ImportError naming the extra that installs it."""
    try:
        import bokeh.plotting  # noqa: F401
    except ImportError:
        raise ImportError(f"the HTML report needs bokeh: {EXTRA}") from None


def resources() -> str:
    """BokehJS and its CSS as inline ``<script>``/``<style>`` tags (core only: the report uses no widgets)."""
    from bokeh.resources import Resources

    return Resources(mode="inline", components=["bokeh"]).render()


def embed(figures: dict) -> tuple[str, dict]:
    """``(script, {name: div})`` for ``figures`` ({name: Bokeh model}), one document for all."""
    from bokeh.embed import components

    if not figures:
        return "", {}
    return components(figures)


def busy_intervals(table: pd.DataFrame, job: int) -> list[tuple[float, float]]:
    """The job's busy intervals on one worker, in ``timestamp`` seconds: each run of consecutive samples
    that count for the job, widened by half a sampling interval on each side."""
    mask = jobtags.counts_for(table, job)
    if not mask.any():
        return []
    half = interval_seconds(table) / 2
    runs = (mask != mask.shift()).cumsum()[mask]
    spans = table.loc[mask, "timestamp"].astype(float).groupby(runs.to_numpy()).agg(["min", "max"])
    return [(float(a) - half, float(b) + half) for a, b in spans.to_numpy()]


def timeline_data(tables: dict, metrics: dict) -> dict:
    """One ColumnDataSource per worker: ``t`` (seconds) and each device column of ``metrics``
    ({metric: divisor}), divided for display."""
    from bokeh.models import ColumnDataSource

    out = {}
    for worker, table in tables.items():
        data = {"t": table["timestamp"].astype(float).to_numpy()}
        for metric, divisor in metrics.items():
            for column in device_columns(table, metric):
                data[column] = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float) / divisor
        out[worker] = ColumnDataSource(data)
    return out


def timeline(tables: dict, data: dict, job: int, metric: str, label: str, x_range=None):
    """One line per worker and GPU of ``metric`` over the session (``data``: :func:`timeline_data`), the job's
    busy intervals shaded; the y axis from 0 (percentages: 0-100), each line its own color and dash."""
    from bokeh.models import BoxAnnotation, HoverTool
    from bokeh.plotting import figure

    fig = figure(
        title=f"Job {job}: {label}",
        height=280,
        sizing_mode="stretch_width",
        tools=TOOLS,
        x_axis_label="seconds since collection start",
        y_axis_label=label,
        **({"x_range": x_range} if x_range is not None else {}),
    )
    k = 0
    for worker, table in tables.items():
        for column in device_columns(table, metric):
            device = column[len(metric) :].strip("[]")
            name = f"worker {table.attrs.get('worker_index', worker)}" + (f" GPU {device}" if device else "")
            fig.line(
                "t",
                column,
                source=data[worker],
                legend_label=name,
                color=COLORS[k % len(COLORS)],
                line_dash=DASHES[k % len(DASHES)],
                line_width=1.5,
            )
            k += 1
        for left, right in busy_intervals(table, job):
            fig.add_layout(BoxAnnotation(left=left, right=right, fill_color=BUSY_COLOR, fill_alpha=0.12, line_alpha=0))
    fig.y_range.start = 0
    if unit_of(metric) == "%":
        fig.y_range.end = 100
    fig.add_tools(HoverTool(tooltips=[("t", "@t{0.0} s"), ("value", "$y{0.0}")]))
    fig.legend.click_policy = "hide"
    fig.legend.location = "top_left"
    return fig


def bars(frame: pd.DataFrame, job: int, label: str):
    """Horizontal bars of ``value`` per ``prefix / activity`` (one unit)."""
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure

    names = (frame["prefix"] + " / " + frame["activity"]).tolist()
    source = ColumnDataSource({"name": names, "value": frame["value"].astype(float).tolist()})
    fig = figure(
        title=f"Job {job}: {label}",
        y_range=list(reversed(names)),
        height=60 + 24 * len(names),
        sizing_mode="stretch_width",
        tools="save",
        x_axis_label=label,
        tooltips=[("", "@name"), ("value", "@value{0.000}")],
    )
    fig.hbar(y="name", right="value", height=0.7, source=source, color=COLORS[0])
    fig.x_range.start = 0
    return fig
