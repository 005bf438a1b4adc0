"""The scheduler dashboard's "GPU Jobs" page (:data:`~..names.DASHBOARD_PAGE`), live, with no other server.

Added by the job plugin to the scheduler's own dashboard when it starts (:func:`install`; with
``Monitor.attach`` on a running scheduler and with ``--preload``), listed in its "More" menu and in
``/individual-plots.json`` (JupyterLab's Dask panel), whether or not the scheduler has a GPU. Each open
page redraws from the plugin's :class:`.livestate.LiveState` every :data:`~.livestate.POLL_S` when new
heartbeats arrived: a table per job, a 5-minute strip of each worker's GPUs (utilization and memory,
coloured by the job running there, the task prefixes on hover; new bars are streamed), and the health of
each sampling process. Bokeh is imported only when a page is opened (the dashboard needs it anyway).
"""

from __future__ import annotations

import html
import time

from .. import _dask
from ..names import DASHBOARD_PAGE, JOBS_PLUGIN
from .livestate import POLL_S, formatted

WIDTH = 1000
MIN_SPAN_S = 30.0  # the strips' shortest time axis (they span the data up to 5 minutes)
MAX_ROWS = 32  # GPU strips drawn (the first, by worker address and GPU position)
IDLE, SEVERAL = "#d9d9d9", "#525252"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
JOB_COLUMNS = (
    ("job", "Job"),
    ("label", "Label"),
    ("util", "GPU util now"),
    ("sm", "SM active now"),
    ("mem", "GPU memory held"),
    ("gpus", "GPUs now"),
    ("busy", "Busy GPU-s"),
    ("energy", "Energy"),
    ("dags", "DAGs running"),
)
HEALTH_COLUMNS = (
    ("host", "Host"),
    ("pid", "Sampler pid"),
    ("samples", "Samples"),
    ("delivered", "Points delivered"),
    ("kept", "Kept on disk"),
    ("lost", "Points lost"),
    ("age", "Last sample"),
)
_TABLE = "border-collapse:collapse;font-size:13px;min-width:600px"
_CELL = "padding:3px 10px;border-bottom:1px solid #ddd;text-align:left"
NOTE = (
    "<p style='color:#555;font-size:12px'>Per job, <b>its own</b> figures: on a GPU several workers share, "
    "the device's utilization and SM active x the share of the GPU's kernel time of the worker running the "
    "job (NVML per-process utilization), so the jobs of a GPU add up to at most the device; summed over the "
    "job's GPUs (250 % = two and a half GPUs busy); split among the jobs of one worker by their tasks. "
    "Busy GPU-s and energy: the samplers' accounting so far. '-': cannot be known now (not tracked, no GPM, "
    "a shared GPU's share not read yet). Memory held: the job's workers' own processes (NVML compute "
    "processes; a worker running two jobs counts for both). The strips show each GPU's device-wide reading "
    "(every process on it), coloured by the job running on that worker; hover for the task prefixes.</p>"
)


def install(scheduler) -> bool:
    """Serve the page on ``scheduler``'s dashboard; False when it has none."""
    return _dask.add_dashboard_page(scheduler, DASHBOARD_PAGE, gpu_jobs_doc)


def color(jobs: str) -> str:
    """A job's colour ('' = idle; several jobs at once share one)."""
    if not jobs:
        return IDLE
    return SEVERAL if "," in jobs else PALETTE[int(jobs) % len(PALETTE)]


def gpu_jobs_doc(scheduler, extra, doc) -> None:
    page = GpuJobsPage(scheduler)
    page.update()
    doc.add_periodic_callback(page.update, int(POLL_S * 1000))
    doc.add_root(page.layout)
    doc.title = "Dask: GPU per job"


class GpuJobsPage:
    """One open page: its Bokeh models and what it has drawn."""

    def __init__(self, scheduler):
        from bokeh.layouts import column
        from bokeh.models import ColumnDataSource, Div

        self.scheduler = scheduler
        self.status = Div(text="", sizing_mode="stretch_width")
        # tables as HTML: Bokeh 3.9's DataTable does not redraw when its data changes (bokeh#15328)
        self.jobs, self.health = Div(text="", name="jobs"), Div(text="", name="health")
        self.strips = ColumnDataSource({k: [] for k in _STRIP_COLUMNS}, name="strips")
        self.util = self._strip_figure("GPU utilization", "top_util")
        self.memory = self._strip_figure("GPU memory used", "top_mem")
        self.memory.x_range, self.memory.y_range = self.util.x_range, self.util.y_range
        self.layout = column(
            self.status,
            Div(text="<b>Jobs</b>"),
            self.jobs,
            self.util,
            self.memory,
            Div(text="<b>Sampling health per host</b>"),
            self.health,
            Div(text=NOTE, width=WIDTH),
        )
        self._state, self._taken, self._rows, self._sent = None, -1, {}, {}

    def _strip_figure(self, title: str, top: str):
        from bokeh.models import HoverTool, Range1d
        from bokeh.plotting import figure

        fig = figure(
            title=f"{title} of each worker's GPUs (device-wide), last 5 minutes, coloured by the job running there",
            x_axis_type="datetime",
            y_range=Range1d(0, 1),
            x_range=Range1d(0, 1),
            width=WIDTH,
            height=120,
            tools="",
            toolbar_location=None,
        )
        fig.quad(
            left="left",
            right="right",
            bottom="bottom",
            top=top,
            fill_color="color",
            line_color=None,
            source=self.strips,
            legend_field="job",
        )
        fig.add_layout(fig.legend[0], "right")
        fig.legend.label_text_font_size = fig.yaxis.major_label_text_font_size = "8pt"
        fig.ygrid.grid_line_color = None
        fig.add_tools(
            HoverTool(
                tooltips=[
                    ("GPU", "@gpu"),
                    ("job", "@job"),
                    ("utilization", "@util %"),
                    ("memory", "@mem MiB of @total MiB"),
                    ("tasks", "@prefixes"),
                ]
            )
        )
        return fig

    def update(self) -> None:
        plugin = self.scheduler.plugins.get(JOBS_PLUGIN)
        state = getattr(plugin, "live", None)
        if state is None or (state is self._state and state.taken == self._taken):
            self._say(plugin, state)
            return
        now = time.time()
        if state is not self._state:  # a new session: start the strips afresh
            self._state, self._rows, self._sent = state, {}, {}
            self.strips.data = {k: [] for k in _STRIP_COLUMNS}
        self._taken = state.taken
        self._say(plugin, state)
        self.jobs.text = html_table(JOB_COLUMNS, [formatted(r) for r in state.jobs(now, plugin.book)], "no job yet")
        health = [
            {
                "host": h["host"],
                "pid": str(h["pid"]),
                "samples": str(h["samples"]),
                "delivered": ", ".join(f"{s}: {d}" for s, d, _, _ in h["sinks"]),
                "kept": str(sum(kept for _, _, kept, _ in h["sinks"])),
                "lost": str(sum(lost for *_, lost in h["sinks"])),
                "age": f"{h['age']:.1f} s ago",
            }
            for h in state.health(now)
        ]
        self.health.text = html_table(HEALTH_COLUMNS, health, "no sampler has reported yet")
        self._stream(plugin, state, now)

    def _say(self, plugin, state) -> None:
        self.status.text = status(plugin, state, time.time())

    def _stream(self, plugin, state, now: float) -> None:
        """New bars of each strip (at most :data:`MAX_ROWS` strips), the x range the last 5 minutes."""
        new = {k: [] for k in _STRIP_COLUMNS}
        if len(self._rows) < MAX_ROWS and len(state.strips) > len(self._rows):  # new strips: drawn while room
            for key in sorted(k for k in state.strips if k not in self._rows)[: MAX_ROWS - len(self._rows)]:
                self._rows[key] = len(self._rows)
        for key, y in self._rows.items():
            strip = state.strips.get(key)
            if not strip or strip[-1][0] <= self._sent.get(key, 0.0):
                continue
            sent, bars = self._sent.get(key, 0.0), []
            for bar in reversed(strip):  # the new ones are at the end
                bars.append(bar)
                if bar[0] <= sent:
                    break
            bars.reverse()
            previous = bars[0][0] - POLL_S if bars[0][0] > sent else bars.pop(0)[0]
            gpu = f"{key[0]} {_uuid(plugin, key)}"
            for t, util, mem, total, jobs, prefixes in bars:
                _bar(new, gpu, y, previous, t, util, mem, total, jobs, prefixes)
                previous = t
            self._sent[key] = strip[-1][0]
        if new["left"]:
            self.strips.stream(new, rollover=MAX_ROWS * int(state.window / POLL_S + 10))
        first = min((state.strips[k][0][0] for k in self._rows if k in state.strips), default=now)
        start = max(now - state.window, min(first, now - MIN_SPAN_S))  # the last 5 minutes, or since the first bar
        self.util.x_range.start, self.util.x_range.end = start * 1000, now * 1000
        rows = max(len(self._rows), 1)
        self.util.y_range.end = rows
        for fig in (self.util, self.memory):
            fig.height = 90 + 22 * rows
            fig.yaxis.ticker = [y + 0.5 for y in range(len(self._rows))]
            fig.yaxis.major_label_overrides = {y + 0.5: _label(plugin, key) for key, y in self._rows.items()}


_STRIP_COLUMNS = (
    "left",
    "right",
    "bottom",
    "top_util",
    "top_mem",
    "color",
    "job",
    "gpu",
    "util",
    "mem",
    "total",
    "prefixes",
)


def _bar(new: dict, gpu: str, y: int, left: float, right: float, util, mem, total, jobs: str, prefixes: str) -> None:
    for name, value in (
        ("left", left * 1000),
        ("right", right * 1000),
        ("bottom", y + 0.05),
        ("top_util", y + 0.05 + 0.9 * (util or 0) / 100),
        ("top_mem", y + 0.05 + 0.9 * (mem / total if mem is not None and total else 0)),
        ("color", color(jobs)),
        ("job", f"job {jobs}" if jobs else "idle"),
        ("gpu", gpu),
        ("util", "-" if util is None else str(util)),
        ("mem", "-" if mem is None else str(mem)),
        ("total", "-" if total is None else str(total)),
        ("prefixes", prefixes or "-"),
    ):
        new[name].append(value)


def html_table(columns, rows: list[dict], empty: str) -> str:
    """``rows`` (text by column name) as an HTML table with ``columns`` (``(name, title)``), escaped."""
    head = "".join(f"<th style='{_CELL}'>{html.escape(title)}</th>" for _, title in columns)
    body = "".join(
        "<tr>" + "".join(f"<td style='{_CELL}'>{html.escape(r[name])}</td>" for name, _ in columns) + "</tr>"
        for r in rows
    )
    body = body or f"<tr><td style='{_CELL}' colspan='{len(columns)}'>{html.escape(empty)}</td></tr>"
    return f"<table style='{_TABLE}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _uuid(plugin, key: tuple) -> str:
    """A strip's GPU: its UUID from what the worker recorded (its ``devices``, in its order), else its position."""
    address, i = key
    devices = ((plugin.destinations.get(address) or {}).get("gpu") or {}).get("devices") or ()
    return devices[i] if i < len(devices) else f"GPU {i}"


def _label(plugin, key: tuple) -> str:
    return f"{key[0].rpartition('://')[2]} {_uuid(plugin, key)[:12]}"


def status(plugin, state, now: float) -> str:
    """The page's first line: what it shows, or plainly why it shows nothing."""
    if plugin is None:
        return (
            "<b>No monitor is attached to this scheduler.</b> Start one with "
            "<code>Monitor(client).attach(); monitor.start()</code> or <code>dask scheduler --preload "
            "dask_influx_metrics.preload</code>."
        )
    session = plugin.session or plugin.last_session
    if session is None:
        return "<b>No monitoring session has run yet</b> (<code>monitor.start()</code> begins one)."
    running = plugin.session is not None
    head = f"<b>Monitoring session {session['id']}</b> {'running' if running else 'stopped'}"
    fresh = state.fresh(now) if state is not None else {}
    if not fresh and not (state and state.workers):
        found = {w: d.get("gpu", {}) for w, d in plugin.destinations.items() if w != "scheduler"}
        none = sorted(
            {f"{g.get('gpu')} ({g.get('why')})" for g in found.values() if g.get("gpu") not in ("nvml", "simulated")}
        )
        if found and len(none) and all(g.get("gpu") not in ("nvml", "simulated") for g in found.values()):
            return f"{head}. <b>Nothing sampled: the workers found no GPU</b>: {'; '.join(none)}."
        return (
            f"{head}. <b>Nothing sampled yet</b>: no worker has sent figures; they come with each "
            "worker's next heartbeat (every 0.5-2 s) once its sampler has taken a sample."
        )
    gpus = sum(len(e.get("gpus", ())) for e in fresh.values())
    return f"{head}: {len(fresh)} worker(s) reporting now, {gpus} GPU(s); figures as of the workers' latest heartbeats."
