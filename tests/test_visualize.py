"""Line charts and box plots of a per-worker table (dask_influx_metrics.visualize)."""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")

from dask_influx_metrics.client import visualize  # noqa: E402
from dask_influx_metrics.visualize import boxes, lines  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORKER = "tcp://10.0.0.5:40211"


def make_table() -> pd.DataFrame:
    """One worker, 2 GPUs: idle (job 0), job 1, a row shared by jobs 1 and 2, job 2, idle."""
    spec = [("0", "0")] * 3 + [("1", "1")] * 20 + [("1,2", "1,2")] + [("2", "2")] * 17 + [("2", "0")] * 2
    n = len(spec)
    rng = np.random.default_rng(7)
    time = pd.date_range("2026-03-01 12:00:00", periods=n, freq="500ms", tz="UTC", name="time")
    table = pd.DataFrame(
        {
            "job": [j for j, _ in spec],
            "dag": [d for _, d in spec],
            "timestamp": np.round(np.arange(n) * 0.5 + 0.013 + rng.uniform(0, 0.01, n), 6),
            "tasks": rng.integers(0, 4, n),
            "running": ["[]"] * n,
            "compute-util[0]": rng.uniform(0, 40, n).round(1),
            "compute-util[1]": rng.uniform(60, 100, n).round(1),
            "mem-util[0]": rng.uniform(10, 20, n).round(1),
            "mem-util[1]": rng.uniform(30, 50, n).round(1),
            "total-mem[0]": rng.uniform(1e9, 2e9, n).round(),
            "total-mem[1]": rng.uniform(3e9, 4e9, n).round(),
            "host-cpu": rng.uniform(0, 100, n).round(1),
            "host.memory_used": rng.integers(8 * 2**30, 9 * 2**30, n),
            "my-metric": rng.uniform(0, 1, n),
        },
        index=time,
    )
    table.attrs = {"worker": WORKER, "worker_index": 0, "units": {"my-metric": "widgets"}}
    return table


@pytest.fixture
def table() -> pd.DataFrame:
    return make_table()


def job_rows(table, job):
    """The samples that count for ``job``: busy (dag != "0") with the job in the tag (issue 10)."""
    return table[table["job"].str.split(",").map(lambda jobs: str(job) in jobs) & (table["dag"] != "0")]


GIB = 2**30
IN_GIB = {"total-mem", "host.memory_used"}  # byte metrics are drawn in GiB (issue 10)


def assert_png(path):
    data = pathlib.Path(path).read_bytes()
    assert len(data) > 1000
    assert data[:8] == PNG_MAGIC


def box_stats(ax):
    """(q1, median, q3) of each box of ``ax``, left to right, read back from the artists."""
    outlines = sorted((ln for ln in ax.lines if len(ln.get_xdata()) == 5), key=lambda ln: min(ln.get_xdata()))
    stats = []
    for outline in outlines:
        x, y = outline.get_xdata(), outline.get_ydata()
        (median,) = [
            ln.get_ydata()[0]
            for ln in ax.lines
            if len(ln.get_xdata()) == 2
            and sorted(ln.get_xdata()) == sorted({min(x), max(x)})
            and ln.get_ydata()[0] == ln.get_ydata()[1]
        ]
        stats.append((min(y), median, max(y)))
    return stats


def tick_labels(ax):
    """x tick labels, also of axes whose labels sharex hides."""
    return list(ax.xaxis.get_major_formatter().format_ticks(ax.get_xticks()))


# --- lines -----------------------------------------------------------------


def test_lines_writes_png_and_returns_figure(table, tmp_path):
    from matplotlib.figure import Figure

    path = tmp_path / "lines.png"
    fig = lines(table, 1, save=path)
    assert isinstance(fig, Figure)
    assert_png(path)
    # default metrics, like the old tool: compute-util and mem-util
    assert [ax.get_title() for ax in fig.axes] == ["compute-util (%)", "mem-util (%)"]


@pytest.mark.parametrize("job", [1, 2, "2"])
def test_lines_x_is_the_selected_jobs_timestamps(table, job):
    metrics = ["compute-util", "total-mem", "host-cpu"]
    fig = lines(table, job, metrics)
    rows = job_rows(table, job)
    assert len(fig.axes) == 3
    for ax, metric in zip(fig.axes, metrics):
        columns = [c for c in table.columns if c == metric or c.startswith(metric + "[")]
        assert len(ax.lines) == len(columns)
        for line, column in zip(ax.lines, columns):
            np.testing.assert_array_equal(line.get_xdata(), rows["timestamp"].to_numpy())
            np.testing.assert_array_equal(
                line.get_ydata(), rows[column].to_numpy(dtype=float) / (GIB if metric in IN_GIB else 1)
            )


def test_job_two_starts_later_and_shared_row_is_in_both_jobs(table):
    shared = table.loc[table["job"] == "1,2", "timestamp"].item()
    x1 = lines(table, 1, ["compute-util"]).axes[0].lines[0].get_xdata()
    x2 = lines(table, 2, ["compute-util"]).axes[0].lines[0].get_xdata()
    assert len(x1) == 21 and len(x2) == 18  # job 2's 2 idle samples (dag "0") are not job 2's
    assert shared == x1[-1] == x2[0]
    assert x2[0] > 10  # job 2's x is not the start of the table (old tool's bug)


def test_lines_legend_labels_and_non_device_metric(table):
    fig = lines(table, 1, ["compute-util", "host-cpu"])
    gpu_ax, host_ax = fig.axes
    assert [t.get_text() for t in gpu_ax.get_legend().get_texts()] == ["GPU 0", "GPU 1"]
    assert len(host_ax.lines) == 1 and host_ax.get_legend() is None


def test_titles_units_and_labels(table):
    metrics = ["total-mem", "compute-util", "host-cpu", "tasks", "host.memory_used", "my-metric"]
    fig = lines(table, 2, metrics, width=8, height=12)
    assert [ax.get_title() for ax in fig.axes] == [
        "total-mem (GiB)",
        "compute-util (%)",
        "host-cpu (%)",
        "tasks (count)",
        "host.memory_used (GiB)",
        "my-metric (widgets)",  # unit from df.attrs
    ]
    assert [ax.get_ylabel() for ax in fig.axes] == ["GiB", "%", "%", "count", "GiB", "widgets"]
    assert fig.axes[-1].get_xlabel() == "seconds since start"
    assert fig.get_suptitle() == f"{WORKER} - job 2"
    assert tuple(fig.get_size_inches()) == (8, 12)


def test_unit_derivation():
    unit = visualize.unit_of
    assert [unit(m) for m in ("total-mem", "mem-util", "compute-util", "mem-busy", "host-cpu", "worker-cpu")] == [
        "bytes",
        "%",
        "%",
        "%",
        "%",
        "%",
    ]
    assert [unit(m) for m in ("power", "temperature", "sm-clock")] == ["W", "C", "MHz"]
    assert unit("gpu.memory_used") == "MiB" and unit("custom.thing") == "" and unit("thing") == ""
    assert unit("compute-util", {"units": {"compute-util": "percent"}}) == "percent"


def test_metric_given_as_string_and_no_attrs(table):
    table.attrs = {}
    fig = lines(table, 1, "compute-util")
    assert fig.get_suptitle() == "worker - job 1"
    assert fig.axes[0].get_title() == "compute-util (%)"


# --- boxes -----------------------------------------------------------------


@pytest.mark.parametrize("job, freq", [(1, 15), (2, 15), (2, 4), (1, 1), (1, 100)])
def test_boxes_pool_all_gpus_over_freq_samples(table, job, freq):
    fig = boxes(table, job, ["compute-util", "host-cpu"], freq=freq)
    rows = job_rows(table, job)
    n_boxes = math.ceil(len(rows) / freq)
    for ax, columns in zip(fig.axes, (["compute-util[0]", "compute-util[1]"], ["host-cpu"])):
        stats = box_stats(ax)
        assert len(stats) == n_boxes
        labels = tick_labels(ax)
        assert labels == [f"{t:.1f}" for t in rows["timestamp"].to_numpy()[::freq]]
        for b, (q1, median, q3) in enumerate(stats):
            pooled = rows[columns].to_numpy()[b * freq : (b + 1) * freq].ravel()
            assert pooled.size == min(freq, len(rows) - b * freq) * len(columns)
            np.testing.assert_allclose([q1, median, q3], np.percentile(pooled, [25, 50, 75]))


def test_boxes_writes_png_with_titles(table, tmp_path):
    path = tmp_path / "boxes.png"
    fig = boxes(table, 2, ["mem-util", "total-mem"], freq=5, save=str(path))
    assert_png(path)
    assert [ax.get_title() for ax in fig.axes] == ["mem-util (%)", "total-mem (GiB)"]
    assert fig.axes[-1].get_xlabel() == "seconds since start"
    assert fig.get_suptitle() == f"{WORKER} - job 2"
    # first box starts at the shared "1,2" row
    assert tick_labels(fig.axes[0])[0] == f"{table['timestamp'].iloc[23]:.1f}"


# --- errors ----------------------------------------------------------------


@pytest.mark.parametrize("plot", [lines, boxes])
def test_unknown_job_lists_jobs_present(table, plot):
    with pytest.raises(ValueError, match=r"job 7 not in .*jobs present: 1, 2$"):  # job 0 is only idle samples
        plot(table, 7, ["compute-util"])


@pytest.mark.parametrize("plot", [lines, boxes])
def test_unknown_metric_lists_metrics_present(table, plot):
    with pytest.raises(ValueError, match=r"\['power'\] not in .*compute-util, mem-util, total-mem") as info:
        plot(table, 1, ["compute-util", "power"])
    assert "running" not in str(info.value) and "timestamp" not in str(info.value)


def test_no_default_metric_present(table):
    with pytest.raises(ValueError, match="none of the default metrics .* host-cpu"):
        lines(table.drop(columns=[c for c in table.columns if "util" in c]), 1)
    with pytest.raises(ValueError, match="metrics is empty"):
        lines(table, 1, [])


@pytest.mark.parametrize("freq", [0, -3, 2.5, True])
def test_boxes_bad_freq(table, freq):
    with pytest.raises(ValueError, match="freq"):
        boxes(table, 1, ["compute-util"], freq=freq)


def test_empty_selection(table):
    with pytest.raises(ValueError, match="no samples"):
        lines(table.iloc[:0], 1)
    with pytest.raises(TypeError, match="CSV path or a DataFrame"):
        lines([1, 2], 1)


def test_missing_matplotlib_names_the_extra(table, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install dask-influx-metrics\[plot\]"):
        lines(table, 1)


def test_headless_and_no_pyplot(tmp_path):
    """No display needed, and no figure left behind in pyplot's registry."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_visualize import make_table
        from dask_influx_metrics.visualize import boxes, lines
        lines(make_table(), 1, save={str(tmp_path / "a.png")!r})
        boxes(make_table(), 2, save={str(tmp_path / "b.png")!r})
        import matplotlib.pyplot as plt  # (boxplot itself may import it, via rcParams)
        assert plt.get_fignums() == [], plt.get_fignums()
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    assert_png(tmp_path / "a.png")
    assert_png(tmp_path / "b.png")


# --- old-layout CSV files ----------------------------------------------------

OLD_CSV = """\
job,dag,timestamp,compute-util,mem-util
1,1,0.0,"10, 90","20, 40"
1,1,0.5,"12, 88","21, 41"
1,1,1.0,"14, 86","22, 42"
2,2,1.5,"50, 60","30, 50"
2,2,2.0,"52, 62","31, 51"
"""


@pytest.fixture
def old_csv(tmp_path):
    pytest.importorskip("dask_influx_metrics.client.csvfiles")
    path = tmp_path / "worker-0.csv"
    path.write_text(OLD_CSV)
    return path


@pytest.mark.parametrize("as_str", [False, True])
def test_lines_from_old_csv(old_csv, tmp_path, as_str):
    out = tmp_path / "csv-lines.png"
    fig = lines(str(old_csv) if as_str else old_csv, 2, save=out)
    assert_png(out)
    assert fig.get_suptitle().endswith(" - job 2")
    assert [ax.get_title() for ax in fig.axes] == ["compute-util (%)", "mem-util (%)"]
    compute = fig.axes[0]
    assert [t.get_text() for t in compute.get_legend().get_texts()] == ["GPU 0", "GPU 1"]
    np.testing.assert_array_equal(compute.lines[0].get_xdata(), [1.5, 2.0])
    np.testing.assert_array_equal(compute.lines[1].get_ydata(), [60, 62])


def test_old_csv_plots_every_row_of_the_job(tmp_path):
    """The old tool's dag column lagged (job 1's first rows read dag 0): its files count every row of a job."""
    path = tmp_path / "worker_0.csv"
    path.write_text(OLD_CSV.replace("1,1,0.0,", "1,0,0.0,").replace("1,1,0.5,", "1,0,0.5,"))
    fig = lines(path, 1, ["compute-util"])
    np.testing.assert_array_equal(fig.axes[0].lines[0].get_xdata(), [0.0, 0.5, 1.0])
    assert spans(fig.axes[0]) == [(-0.25, 1.25)]


def test_boxes_from_old_csv(old_csv):
    fig = boxes(old_csv, 1, ["compute-util"], freq=2)
    stats = box_stats(fig.axes[0])
    assert len(stats) == 2
    np.testing.assert_allclose(stats[0], np.percentile([10, 90, 12, 88], [25, 50, 75]))
    assert tick_labels(fig.axes[0]) == ["0.0", "1.0"]


# --- a job's own time only (issue 10) ------------------------------------------


def shared_gpu_table(tmp_path):
    """Worker 0 of the H100 scenario (tests/shared_gpu.py), read back from a spool."""
    import shared_gpu

    from dask_influx_metrics import query

    with query.connect(shared_gpu.write_spool(tmp_path)) as db:
        return query.worker_tables(db, metrics=["compute-util", "total-mem", "worker-gpu-mem"])[shared_gpu.W[0]]


def spans(ax):
    """(start, end) of the shaded busy intervals of ``ax``."""
    return [(round(p.get_x(), 6), round(p.get_x() + p.get_width(), 6)) for p in ax.patches]


def test_a_jobs_plot_leaves_out_its_workers_idle_time(tmp_path):
    table = shared_gpu_table(tmp_path)
    fig = lines(table, 1, ["compute-util", "total-mem", "worker-gpu-mem"], save=tmp_path / "job1.png")
    assert_png(tmp_path / "job1.png")
    util, total, own = fig.axes
    # job 1's six busy samples, not the idle ones (job "1", dag "0") that show job 2's 100 % and 21 GiB
    np.testing.assert_allclose(util.lines[0].get_xdata(), np.arange(6) * 0.5)
    assert max(util.lines[0].get_ydata()) == 70
    assert [ax.get_title() for ax in (total, own)] == ["total-mem (GiB)", "worker-gpu-mem (GiB)"]
    assert max(total.lines[0].get_ydata()) == 5 and max(own.lines[0].get_ydata()) == 5
    assert spans(util) == [(-0.25, 2.75)]


def test_busy_intervals_are_shaded_and_lines_break_between_them(table):
    table = table.assign(
        dag=["0"] * 3 + ["1"] * 5 + ["0"] * 4 + ["1"] * 11 + ["1,2"] + ["2"] * 17 + ["0"] * 2,
        job=["0"] * 3 + ["1"] * 20 + ["1,2"] + ["2"] * 19,
    )
    fig = lines(table, 1, ["compute-util"])
    ax = fig.axes[0]
    t = table["timestamp"].to_numpy()
    half = np.median(np.diff(t)) / 2
    assert spans(ax) == [
        (round(t[3] - half, 6), round(t[7] + half, 6)),
        (round(t[12] - half, 6), round(t[23] + half, 6)),
    ]
    x = ax.lines[0].get_xdata()
    assert len(x) == 5 + 1 + 12 and np.isnan(x[5]) and np.isnan(ax.lines[0].get_ydata()[5])
    assert not boxes(table, 1, ["compute-util"], freq=5).axes[0].patches  # boxes: samples of the job, no shading


# --- axes and styles: no 4 % band that makes noise look dramatic, no line hiding another ---------------


def _flat_table() -> pd.DataFrame:
    """Job 1 on 2 GPUs with equal readings: utilization in a narrow band (50-52 %), equal memory."""
    table = make_table()
    n = len(table)
    band = 50 + 2 * (np.arange(n) % 2)
    for gpu in (0, 1):
        table[f"compute-util[{gpu}]"] = band.astype(float)
        table[f"total-mem[{gpu}]"] = np.full(n, 3.0 * GIB) + np.arange(n) * 1e6
    return table


@pytest.mark.parametrize("plot", [lines, boxes])
def test_utilization_axes_span_0_to_100_and_memory_starts_at_0(plot):
    fig = plot(_flat_table(), 1, ["compute-util", "total-mem", "host-cpu"])
    util, mem, cpu = fig.axes[:3]
    assert util.get_ylim() == (0, 100)
    assert cpu.get_ylim() == (0, 100)
    assert mem.get_ylim()[0] == 0 and mem.get_ylim()[1] >= 3.0  # GiB


def test_percent_axis_grows_past_100_when_a_value_does():
    table = _flat_table()
    table["worker.cpu_percent"] = 250.0  # several cores
    (ax,) = lines(table, 1, ["worker.cpu_percent"]).axes
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 250


def test_negative_custom_metric_keeps_autoscale():
    table = _flat_table()
    table["my-metric"] = np.linspace(-5, -1, len(table))
    (ax,) = lines(table, 1, ["my-metric"]).axes
    assert ax.get_ylim()[0] < -4


def test_equal_lines_stay_distinguishable():
    """Two GPUs with equal readings: different dashes and markers, markers at different samples."""
    (ax,) = lines(_flat_table(), 1, ["compute-util"]).axes
    gpu0, gpu1 = ax.lines
    assert gpu0.get_ydata().tolist() == gpu1.get_ydata().tolist()
    assert gpu0.get_linestyle() != gpu1.get_linestyle()
    assert gpu0.get_marker() != gpu1.get_marker()
    assert gpu0.get_markevery() != gpu1.get_markevery()
    start0, stride = gpu0.get_markevery()
    start1, _ = gpu1.get_markevery()
    assert {i for i in range(start0, len(gpu0.get_xdata()), stride)}.isdisjoint(
        range(start1, len(gpu1.get_xdata()), stride)
    )
