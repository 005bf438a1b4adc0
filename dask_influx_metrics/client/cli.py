"""Command line: ``dask-influx-metrics``, ``python -m dask_influx_metrics``, ``dask influx-metrics``.

All three run :data:`cli`, a click group (Dask's ``dask`` command finds it
through the ``dask_cli`` entry point group). Every subcommand that reads
metrics takes the same connection options (see :func:`store_options`) and
opens a :class:`dask_influx_metrics.query.Store` with them. Errors the data
cannot avoid (``QueryError``, ``ValueError``, ``OSError``, ``ImportError``)
print one line, ``error: ...``, on stderr and exit with status 2; so does a
listing that finds nothing in the asked range and tags. The Store's notes
(corrupt spool lines skipped, undelivered samples read) go to stderr as
``note: ...`` lines.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(cli, ["jobs", "--source", "/nonexistent"]).stderr
"error: spool folder '/nonexistent' does not exist\\n"
"""

from __future__ import annotations

import functools
import sys

import click

from .cliopts import (
    SOURCE_ENV,
    Group,
    emit,
    format_option,
    found,
    influxdb_options,
    job_option,
    metrics_option,
    per_job_option,
    store_options,
    workers_option,
)


@click.group(
    name="influx-metrics",
    cls=Group,
    epilog=f"Set ${SOURCE_ENV} to skip --source. Errors print 'error: ...' on stderr and exit with status 2.",
)
@click.version_option(package_name="dask-influx-metrics")
def cli():
    """Query the GPU and host metrics a dask-influx-metrics Monitor collected.

    The data is read from InfluxDB (InfluxQL or Flux) or from a local spool
    folder; every command takes the same --source/--database/--tag/... options.

    \b
    Example:
      dask-influx-metrics jobs --source http://influx:8086 --tag run=nightly
    """


@cli.command()
@format_option
@store_options
def sessions(open_store, fmt):
    """Monitoring sessions in the source, newest first.

    Columns: index (what --session takes: 1 = the latest), session (its
    id; "unnamed": points written before sessions were tagged), start, end,
    and how many workers, jobs and hosts wrote points. Job and DAG numbers
    restart at 1 in each session; every other command reads one session.

    \b
    Example:
      dask-influx-metrics sessions --source http://127.0.0.1:8086
      dask-influx-metrics jobs --session 2 --source http://127.0.0.1:8086
    """
    db = open_store()
    db.session_note = ""  # which one a reading command would read: not this listing's business
    emit(found(db, db.sessions(), "sessions"), fmt)


@cli.command()
@format_option
@click.option(
    "--gpus",
    is_flag=True,
    help="One row per worker and physical GPU it used (host, uuid), "
    "with shared=True where several workers of a host used that GPU.",
)
@store_options
def workers(open_store, fmt, gpus):
    """Worker index and address (with --gpus: the GPUs each used, shared ones marked).

    The index is the numbering every --worker option and CSV file uses.

    \b
    Example:
      dask-influx-metrics workers --gpus --source http://127.0.0.1:8086
    """
    import pandas as pd

    db = open_store()
    if gpus:
        return emit(db.gpus(), fmt)
    emit(pd.DataFrame(list(found(db, db.worker_map(), "worker samples").items()), columns=["index", "address"]), fmt)


@cli.command()
@format_option
@store_options
def jobs(open_store, fmt):
    """Job numbers that have samples, one a line.

    \b
    Example:
      dask-influx-metrics jobs --source http://127.0.0.1:8086 --database dask_metrics
    """
    db = open_store()
    emit(found(db, db.jobs(), "jobs"), fmt, "job")


@cli.command()
@job_option
@format_option
@store_options
def dags(open_store, job, fmt):
    """DAGs (graph submissions): job, status, times, duration, tasks.

    Columns: dag, job, status, submitted, ended, duration (s), tasks, label.

    \b
    Example:
      dask-influx-metrics dags --job 2 --source /tmp/dask-influx-metrics
    """
    db = open_store()
    emit(found(db, db.dags(job=job), "DAGs"), fmt)


@cli.command()
@format_option
@store_options
def metrics(open_store, fmt):
    """Names of the metrics present in the data, one a line.

    \b
    Example:
      dask-influx-metrics metrics --source /tmp/dask-influx-metrics
    """
    db = open_store()
    emit(found(db, db.metrics(), "metrics"), fmt, "metric")


@cli.command()
@click.argument("metric")
@per_job_option
@workers_option
@job_option
@click.option("--client-side", is_flag=True, help="Compute peaks from the samples here, not on the server.")
@format_option
@store_options
def peaks(open_store, metric, per_job, workers, job, client_side, fmt):
    """Peak of METRIC per worker, GPU (and job).

    table/csv give the tidy frame (worker_index, worker, job, device, metric,
    peak, unit); json gives the old get_peaks lists: per worker, {job: [peak
    per GPU]} with --per-job, else [peak per GPU].

    \b
    Example:
      dask-influx-metrics peaks compute-util --worker 0,2 --format json --source /tmp/dask-influx-metrics
    """
    from . import peaks as _peaks

    db, server = open_store(), not client_side
    if fmt == "json":
        emit(_peaks.get_peaks(db, metric, workers=workers, per_job=per_job, job=job, server=server), fmt)
    else:
        emit(_peaks.peaks(db, metric, per_job=per_job, workers=workers, job=job, server=server), fmt)


@cli.command()
@per_job_option
@workers_option
@click.option("--job", type=int, metavar="N", help="Only job N's rows (see `jobs`), no whole-session rows.")
@click.option(
    "--resource",
    "resources",
    metavar="R[,R]",
    help="Only these resources' rows: gpu, cpu, memory, disk, network (default: all).",
)
@format_option
@store_options
def summary(open_store, per_job, workers, job, resources, fmt):
    """GPU utilization per worker and its node's CPU, memory, disk and network:
    over the whole session (job "all"; empty in csv, null in json) and per job.

    gpu and cpu: mean and max (%), share of samples above 20/40/80% and at
    100%, device hours and unused device hours. Each worker's gpu rows are its
    own view of the GPUs it uses; the last gpu rows, worker "all workers",
    count each physical GPU once (two workers sharing a GPU: its hours once).
    The node rows (cpu, memory, disk, network; column host) are the worker's
    host's: cpu adds core_max/core_min (the busiest and idlest core, % of one
    core) and counts cores (devices, CPU core-hours); memory the host memory in
    use (%); disk the fullest of the workers' filesystems (%) and the bytes
    read and written; network the bytes sent and received on loopback (lo_)
    and external (ext_) interfaces. The table leaves out columns without a
    figure; csv and json hold every column.

    \b
    Example:
      dask-influx-metrics summary --job 1 --resource cpu,network --format csv --source http://127.0.0.1:8086
    """
    from . import summary as _summary

    frame = _summary.summary(open_store(), per_job=per_job, workers=workers, job=job)
    if resources:
        wanted = [r.strip() for r in resources.split(",") if r.strip()]
        unknown = sorted(set(wanted) - {"gpu", "cpu", "memory", "disk", "network"})
        if unknown:
            raise click.UsageError(f"unknown resource(s) {unknown}; known: gpu, cpu, memory, disk, network")
        frame = frame[frame["resource"].isin(wanted)].reset_index(drop=True)
    if fmt == "table":  # name the whole-session rows, and the all-workers ones' index (pandas would print <NA>)
        frame = frame.assign(
            job=frame["job"].astype("string").fillna("all"),
            worker_index=frame["worker_index"].astype("string").fillna("-"),
        ).dropna(axis=1, how="all")
    emit(frame, fmt)


@cli.command()
@job_option
@format_option
@store_options
def accounting(open_store, job, fmt):
    """Per-job GPU accounting: the sampling agents' running totals (tracking name accounting).

    One row per job and GPU (host, uuid), per job and host (CPU: uuid empty),
    per job (totals: host and uuid empty) and the idle rows (job "idle": no
    job's). Columns: gpu_seconds, busy_seconds, sm_active_seconds,
    tensor_active_seconds, energy_joules, memory_peak_bytes,
    memory_mean_bytes, cpu_seconds. A lost point costs no total: each
    carries the totals so far.

    \b
    Example:
      dask-influx-metrics accounting --job 2 --format csv --source http://127.0.0.1:8086
    """
    from . import accounting as _accounting

    db = open_store()
    frame = _recorded(db, _accounting.accounting(db, job=job))
    if fmt != "json":  # name the idle and total rows (pandas would print <NA>)
        frame = frame.assign(
            job=frame["job"].astype("string").fillna("idle"),
            host=frame["host"].astype("string").fillna("all" if fmt == "table" else ""),
            uuid=frame["uuid"].astype("string").fillna("-" if fmt == "table" else ""),
        )
    else:
        frame = frame.assign(job=frame["job"].astype(object).where(frame["job"].notna(), "idle"))
    emit(frame, fmt)


@cli.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--fname", default="worker", show_default=True, help="File name prefix: DIR/<fname>_<index>.csv.")
@click.option("--clear-dir", is_flag=True, help="First delete the <fname>_*.csv files already in DIR (only those).")
@metrics_option
@workers_option
@job_option
@store_options
def export(open_store, directory, fname, clear_dir, metrics, workers, job):
    """Write per-worker CSV files into DIR and print their names.

    One DIR/<fname>_<index>.csv per worker (the old dask-metrics layout)
    plus workers.csv (index, address, file). Progress goes to stderr.

    \b
    Example:
      dask-influx-metrics export out/ --job 2 --metrics compute-util,mem-util --source /tmp/dask-influx-metrics
    """
    from .csvfiles import to_csv

    db = open_store()
    total = len(workers or db.workers())
    with click.progressbar(length=total, label=f"reading worker 0/{total}", file=sys.stderr) as bar:

        def progress(done, total):
            bar.label = f"reading worker {done}/{total}"  # off a terminal, each new label is a line
            bar.update(done - bar.pos)

        paths = to_csv(db, directory, fname, clear_dir, metrics, workers, job=job, progress=progress)
    click.echo("\n".join(paths))


@cli.command()
@click.argument("kind", type=click.Choice(["lines", "boxes"]))
@click.option("--job", type=int, required=True, metavar="N", help="The job to plot (see `jobs`).")
@click.option("--worker", metavar="I|ADDR", help="Worker index or address to read from --source [default: 0].")
@click.option(
    "--csv",
    "csv_file",
    type=click.Path(exists=True, dir_okay=False),
    metavar="FILE",
    help="Plot this exported CSV file instead of reading --source.",
)
@metrics_option
@click.option("--freq", type=click.IntRange(min=1), default=15, show_default=True, help="boxes: samples per box.")
@click.option("--width", type=float, default=20, show_default=True, help="Figure width (inches).")
@click.option("--height", type=float, default=10, show_default=True, help="Figure height (inches).")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Image to write; the format follows the extension (.png, .svg, .pdf).",
)
@store_options
def plot(open_store, kind, job, worker, csv_file, metrics, freq, width, height, out):
    """Plot one worker's metrics during one job (lines or boxes).

    KIND is lines (a line per GPU) or boxes (box plots of --freq samples).
    Default metrics: compute-util and mem-util. Needs matplotlib.

    \b
    Examples:
      dask-influx-metrics plot lines --job 2 --worker 1 --out job2.png --source /tmp/dask-influx-metrics
      dask-influx-metrics plot boxes --job 1 --csv out/worker_0.csv --freq 10 --out job1.png
    """
    from . import visualize
    from .tables import worker_tables

    if csv_file is not None:
        if worker is not None:
            raise click.UsageError("give --worker or --csv, not both")
        source = csv_file
    else:
        db = open_store()
        worker = 0 if worker is None else int(worker) if worker.isdigit() else worker
        if metrics is None:  # read only what the plot will show
            metrics = [m for m in visualize.DEFAULT_METRICS if m in db.metrics()] or None
        source = next(iter(worker_tables(db, job=job, metrics=metrics, workers=[worker]).values()))
    draw = visualize.lines if kind == "lines" else functools.partial(visualize.boxes, freq=freq)
    draw(source, job, metrics, width=width, height=height, save=out)
    click.echo(out)


def _recorded(db, frame):
    """``frame``, or an error saying why nothing was recorded (``frame.attrs["why"]``) and where."""
    if frame.empty:
        from .query.base import QueryError

        raise QueryError(f"{frame.attrs.get('why', 'nothing recorded')} ({db.scope()})")
    return frame


@cli.command()
@job_option
@click.option("--per-dag", is_flag=True, help="One row per DAG and prefix instead of per job and prefix.")
@click.option("--gpu", is_flag=True, help="Instead: the GPU's readings during each prefix's tasks (was the GPU busy).")
@format_option
@store_options
def tasks(open_store, job, per_dag, gpu, fmt):
    """Task counts and durations per job and task prefix (the task stream).

    Columns: job, [dag,] prefix, tasks, erred, total_s, median_s, p95_s,
    max_s, compute_s, transfer_s, disk_read_s, disk_write_s, nbytes; the
    slowest prefix (total_s) first in each job.

    With --gpu: job, [dag,] prefix, tasks, gpu_s (task seconds covered by
    samples of the workers' own GPUs), mean_utilization_gpu, GPM's
    mean_sm_active, mean_sm_occupancy, mean_pipe_tensor_active where
    collected: the job's own (on a shared GPU, the device's scaled by the
    worker's share of its kernel time); the same as mean_device_* (the
    whole GPU, other work on it included); mean/max_memory_delta (MiB of
    the worker's GPU memory across a task).

    \b
    Example:
      dask-influx-metrics tasks --job 2 --source http://127.0.0.1:8086
      dask-influx-metrics tasks --gpu --source /tmp/dask-influx-metrics
    """
    from . import tasks as _tasks

    db = open_store()
    frame = _tasks.gpu_per_prefix(db, job=job, per_dag=per_dag) if gpu else _tasks.tasks(db, job=job, per_dag=per_dag)
    emit(_recorded(db, frame), fmt)


@cli.command()
@job_option
@click.option("--gpu", is_flag=True, help="Instead: mean/max GPU utilization while each job (and DAG) ran.")
@format_option
@store_options
def activity(open_store, job, gpu, fmt):
    """Where worker time went per job and task prefix (Dask's fine performance metrics).

    Columns: job, prefix, activity (thread-cpu, thread-noncpu, disk-read,
    ... as Dask names them), unit, value (summed over the time range).

    \b
    Example:
      dask-influx-metrics activity --job 1 --format csv --source /tmp/dask-influx-metrics
    """
    from . import tasks as _tasks

    db = open_store()
    emit(_recorded(db, _tasks.gpu_during_tasks(db, job=job) if gpu else _tasks.activity(db, job=job)), fmt)


@cli.command()
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--title", help="Title of the report [default: the source and time range].")
@store_options
def report(open_store, path, title):
    """Write a one-file HTML report to PATH (opens offline; needs bokeh: pip install dask-influx-metrics[report]).

    A session overview, then per job: its DAGs, GPU utilization and memory
    per worker and GPU with the job's busy intervals marked, peaks,
    utilization summary, activity breakdown and slowest task prefixes.

    \b
    Example:
      dask-influx-metrics report gpu-report.html --source http://127.0.0.1:8086 --tag run=nightly
    """
    from . import report as _report

    click.echo(_report.report(open_store(), path, title=title))


@cli.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@format_option
@influxdb_options
def replay(folder, fmt, source, database, options):
    """Write the samples an HTTP sink kept under FOLDER into the InfluxDB of --source.

    FOLDER is a spool session (or root); every undelivered/ (an outage) and
    refused/ (InfluxDB refused them; reasons.txt says why) folder below it is
    replayed. A file is deleted once all its lines were written or refused
    again (those stay in refused/ with the new reason); files InfluxDB did not
    take stay. Run it once the session has stopped. Reading never writes:
    this is the one command that does.

    \b
    Example:
      dask-influx-metrics replay /tmp/dask-influx-metrics-1000/20261121T100000-000001 --source http://127.0.0.1:8086
    """
    import pandas as pd

    from ..sinks.replay import replay_folders

    if not source.startswith(("http://", "https://")):
        raise ValueError(f"replay writes into InfluxDB (an http(s):// URL as --source), not {source!r}")
    emit(pd.DataFrame([replay_folders(folder, source, database, options)]), fmt)


def main(argv=None):
    """Console-script entry point (``dask-influx-metrics``)."""
    return cli.main(args=argv)
