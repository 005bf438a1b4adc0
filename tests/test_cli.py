"""The command line on data from a real monitored LocalCluster (influxd and the spool)."""

import io
import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

from dask_influx_metrics import lineprotocol, query
from dask_influx_metrics.client.cli import SOURCE_ENV, cli
from dask_influx_metrics.sinks.spool import SpoolSink

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def monitored(monitored_both):
    """Every test here runs on both runs: ``dag-tag`` true and false (conftest.py)."""
    return monitored_both


@pytest.fixture(scope="module")
def sources(monitored):
    """CLI arguments (and the matching ``query.connect`` kwargs) for each kind of source."""
    return {
        "influxql": (
            ["--source", monitored.influxd.url, "--database", monitored.database, "--tag", f"run={monitored.run}"],
            {"source": monitored.influxd.url, "database": monitored.database, "tags": {"run": monitored.run}},
        ),
        "spool": (["--source", monitored.spool], {"source": monitored.spool}),
    }


def run(*args, env=None):
    result = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def ok(*args, env=None):
    result = run(*args, env=env)
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_workers_jobs_metrics_dags(sources, monitored, kind):
    args = sources[kind][0]
    lines = ok("workers", *args).stdout.splitlines()
    assert lines[0].split() == ["index", "address"]
    assert [line.split() for line in lines[1:]] == [[str(i), w] for i, w in enumerate(monitored.workers)]
    assert ok("jobs", *args).stdout == "1\n2\n"
    assert json.loads(ok("jobs", "--format", "json", *args).stdout) == [1, 2]
    assert ok("jobs", "--format", "csv", *args).stdout == "job\n1\n2\n"
    assert {"compute-util", "mem-util", "host-cpu"} <= set(ok("metrics", *args).stdout.split())
    dags = json.loads(ok("dags", "--job", 2, "--format", "json", *args).stdout)
    assert [(d["dag"], d["job"], d["status"]) for d in dags] == [(2, 2, "ok")]
    table = ok("dags", *args).stdout.splitlines()
    assert table[0].split()[:3] == ["dag", "job", "status"] and len(table) == 3


@pytest.mark.parametrize("kind", ["influxql", "spool"])
@pytest.mark.parametrize("extra", [[], ["--whole"], ["--worker", "1", "--job", "2"], ["--client-side"]])
def test_peaks_json_equals_get_peaks(sources, kind, extra):
    args, kwargs = sources[kind]
    got = json.loads(ok("peaks", "compute-util", "--format", "json", *extra, *args).stdout)
    db = query.connect(**kwargs)
    per_job = "--whole" not in extra
    expected = query.get_peaks(
        db,
        "compute-util",
        per_job=per_job,
        workers=[1] if "--worker" in extra else None,
        job=2 if "--job" in extra else None,
        server="--client-side" not in extra,
    )
    assert got == json.loads(json.dumps(expected)) and got


def test_peaks_table_and_csv(sources):
    args, kwargs = sources["spool"]
    tidy = query.peaks(query.connect(**kwargs), "total-mem", per_job=False)
    table = ok("peaks", "total-mem", "--whole", *args).stdout
    assert table.splitlines()[0].split() == list(tidy.columns) and len(table.splitlines()) == len(tidy) + 1
    back = pd.read_csv(pd.io.common.StringIO(ok("peaks", "total-mem", "--whole", "--format", "csv", *args).stdout))
    assert list(back["peak"]) == list(tidy["peak"]) and list(back["worker"]) == list(tidy["worker"])


def test_summary(sources):
    args, kwargs = sources["influxql"]
    rows = json.loads(ok("summary", "--job", 1, "--format", "json", *args).stdout)
    expected = query.summary(query.connect(**kwargs), job=1)
    assert len(rows) == len(expected) and {r["resource"] for r in rows} == {"gpu", "cpu", "memory", "disk", "network"}
    assert {r["job"] for r in rows} == {1}  # only job 1's rows: no whole-session ones beside them
    node = json.loads(ok("summary", "--job", 1, "--resource", "cpu,network", "--format", "json", *args).stdout)
    assert {r["resource"] for r in node} == {"cpu", "network"} and all(r["host"] for r in node)
    assert all(r["core_max"] >= r["core_min"] for r in node if r["resource"] == "cpu")
    assert all(r["lo_sent_bytes"] >= 0 and r["core_max"] is None for r in node if r["resource"] == "network")
    table = ok("summary", *args).stdout.splitlines()  # the whole session's rows say so
    rows = [re.match(r"\s*(\S+)\s+(tcp://\S+|all workers)\s+(\S+)", line).groups() for line in table[1:]]
    assert table[0].split()[2] == "job" and {job for _, _, job in rows} == {"all", "1", "2"}
    assert {i for i, w, _ in rows if w == "all workers"} == {"-"}, "each GPU once, over every worker"
    assert "Only job N's rows" in " ".join(ok("summary", "--help").stdout.split())


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_export(sources, monitored, kind, tmp_path):
    out = tmp_path / "csv"
    (out).mkdir()
    (out / "worker_9.csv").write_text("stale")
    result = ok("export", out, "--clear-dir", "--metrics", "compute-util,mem-util", "--job", 2, *sources[kind][0])
    assert result.stdout.splitlines() == [
        str(out / "worker_0.csv"),
        str(out / "worker_1.csv"),
        str(out / "workers.csv"),
    ]
    assert sorted(os.listdir(out)) == ["worker_0.csv", "worker_1.csv", "workers.csv"]
    assert "reading worker 0/2" in result.stderr and "reading worker 2/2" in result.stderr
    assert list(pd.read_csv(out / "workers.csv")["worker"]) == monitored.workers
    frame = pd.read_csv(out / "worker_1.csv", dtype=str)
    assert {"compute-util", "mem-util"} <= set(frame.columns)
    assert frame["job"].str.split(",").apply(lambda js: "2" in js).all()


def _is_png(path):
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("kind", ["lines", "boxes"])
def test_plot_from_source(sources, kind, tmp_path):
    pytest.importorskip("dask_influx_metrics.visualize")
    pytest.importorskip("matplotlib")
    out = tmp_path / f"{kind}.png"
    result = ok(
        "plot",
        kind,
        "--job",
        1,
        "--worker",
        1,
        "--freq",
        5,
        "--width",
        6,
        "--height",
        4,
        "--out",
        out,
        *sources["influxql"][0],
    )
    assert result.stdout == f"{out}\n" and _is_png(out)


def test_plot_from_csv(sources, tmp_path):
    pytest.importorskip("dask_influx_metrics.visualize")
    pytest.importorskip("matplotlib")
    ok("export", tmp_path, *sources["spool"][0])
    out = tmp_path / "boxes.png"
    ok(
        "plot",
        "boxes",
        "--job",
        2,
        "--csv",
        tmp_path / "worker_0.csv",
        "--metrics",
        "compute-util",
        "--width",
        6,
        "--height",
        4,
        "--out",
        out,
    )
    assert _is_png(out)
    result = run("plot", "lines", "--job", 2, "--csv", tmp_path / "worker_0.csv", "--worker", 0, "--out", out)
    assert result.exit_code == 2 and "give --worker or --csv, not both" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["dags", "--job", 7],
        ["peaks", "compute-util", "--job", 7],
        ["export", "{tmp}", "--job", 7],
        ["summary", "--job", 7],
        ["plot", "lines", "--job", 7, "--out", "{tmp}/x.png"],
    ],
)
def test_bad_job_lists_jobs(sources, args, tmp_path):
    if args[0] == "plot":
        pytest.importorskip("dask_influx_metrics.visualize")
    args = [str(a).format(tmp=tmp_path) for a in args]
    result = run(*args, *sources["spool"][0])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "7" in lines[-1] and "[1, 2]" in lines[-1], result.stderr
    assert "Traceback" not in result.output


def test_other_errors_are_one_line(sources, tmp_path):
    result = run("jobs", "--source", "http://127.0.0.1:1", "--timeout", 2)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: cannot reach InfluxDB at http://127.0.0.1:1")
    assert len(result.stderr.splitlines()) == 1
    result = run("jobs", "--source", tmp_path / "missing")
    assert result.exit_code == 2 and result.stderr == f"error: spool folder '{tmp_path / 'missing'}' does not exist\n"
    result = run("peaks", "gpu-magic", *sources["spool"][0])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and "gpu-magic" in result.stderr
    result = run("peaks", "compute-util", "--worker", "5", *sources["spool"][0])
    assert result.exit_code == 2 and result.stderr.startswith("error: no worker 5; workers: ")
    result = run("peaks", "compute-util", "--workers", "1", *sources["spool"][0])  # one spelling, as plot's
    assert result.exit_code == 2 and "No such option '--workers'" in result.stderr and "'--worker'" in result.stderr
    result = run("jobs", "--tag", "oops", *sources["spool"][0])  # a usage error: click's own message
    assert result.exit_code == 2 and "'oops' is not KEY=VALUE" in result.stderr
    result = run("jobs", "--start", "yesterday-ish", *sources["spool"][0])
    assert result.exit_code == 2 and "not a time" in result.stderr


def test_source_from_environment_and_config(monitored):
    import dask

    session = os.listdir(monitored.spool)[0]
    assert (
        ok(
            "jobs",
            "--session",
            session,
            "--start",
            0,
            "--stop",
            "2100-01-01T00:00:00Z",
            env={SOURCE_ENV: monitored.spool},
        ).stdout
        == "1\n2\n"
    )
    result = run("jobs", "--session", "nope", env={SOURCE_ENV: monitored.spool})
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and "nope" in result.stderr
    assert ok("jobs", env={SOURCE_ENV: monitored.spool}).stdout == "1\n2\n"
    with dask.config.set({"influx-metrics.sink": ["udp", "spool"], "influx-metrics.spool.directory": monitored.spool}):
        assert ok("jobs", env={SOURCE_ENV: None}).stdout == "1\n2\n"
    with dask.config.set({"influx-metrics.sink": "udp", "influx-metrics.influxdb.url": "http://127.0.0.1:1"}):
        result = run("jobs", "--timeout", 1, env={SOURCE_ENV: None})
        assert result.exit_code == 2 and "http://127.0.0.1:1" in result.stderr


def test_notes_are_said_once(tmp_path):
    """A spool root with two sessions: which one was read is said once, as a note (not also logged)."""
    import shutil

    import task_points

    root = task_points.write_spool(tmp_path / "spool")
    shutil.copytree(tmp_path / "spool" / "20251123T120000-000001", tmp_path / "spool" / "20251122T120000-000001")
    done = subprocess.run(
        [sys.executable, "-m", "dask_influx_metrics", "jobs", "--source", root],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == "1\n2\n", done.stderr
    assert done.stderr.count("read session '20251123T120000-000001', the latest of 2") == 1, done.stderr
    assert done.stderr.startswith("note: read session")


def test_every_option_has_help():
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param, __import__("click").Option):
                assert param.help, f"{name} {param.opts}"
        assert "Example" in command.help, name


@pytest.mark.parametrize(
    "argv, usage",
    [
        ([os.path.join(BIN, "dask-influx-metrics")], "dask-influx-metrics"),
        ([sys.executable, "-m", "dask_influx_metrics"], "python -m dask_influx_metrics"),
        ([os.path.join(BIN, "dask"), "influx-metrics"], "dask influx-metrics"),
    ],
    ids=["console-script", "python-m", "dask-cli"],
)
def test_entry_points(argv, usage):
    if not os.path.exists(argv[0]):
        pytest.skip(f"{argv[0]} is not installed (pip install -e .)")
    done = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: {usage} [OPTIONS] COMMAND")
    assert {"workers", "jobs", "dags", "metrics", "peaks", "summary", "export", "plot"} <= {
        line.split()[0] for line in done.stdout.split("Commands:")[1].splitlines() if line.strip()
    }
    assert "Warning" not in done.stderr


def test_tasks_activity_and_report(monitored, tmp_path):
    import task_points

    spool = task_points.write_spool(tmp_path / "spool")
    rows = pd.read_csv(io.StringIO(ok("tasks", "--format", "csv", "--source", spool).stdout))
    assert rows[["job", "prefix", "tasks"]].values.tolist() == [
        [1, "matmul", 4],
        [1, "load", 6],
        [2, "matmul", 10],
        [2, "sum", 2],
    ]
    per_dag = json.loads(ok("tasks", "--job", 1, "--per-dag", "--format", "json", "--source", spool).stdout)
    assert [(r["dag"], r["prefix"]) for r in per_dag] == [(2, "matmul"), (1, "load")]
    table = ok("activity", "--job", 2, "--source", spool).stdout.splitlines()
    assert table[0].split() == ["job", "prefix", "activity", "unit", "value"] and len(table) == 3
    gpu = json.loads(ok("activity", "--gpu", "--format", "json", "--source", spool).stdout)
    assert [(r["job"], r["samples"]) for r in gpu if r["dag"] is None] == [(1, 40), (2, 40)]
    out = tmp_path / "r.html"
    assert ok("report", out, "--title", "cli", "--source", spool).stdout == f"{out}\n"
    assert "<title>cli</title>" in out.read_text()
    # the monitored run's own task stream (every metric tracked): job 1 ran 8 tasks, job 2 ran 4
    mine = pd.read_csv(io.StringIO(ok("tasks", "--format", "csv", "--source", monitored.spool).stdout))
    # (Dask's key_split drops the leading "_" of _slow)
    assert sorted(mine[["job", "prefix", "tasks"]].values.tolist()) == [[1, "slow", 8], [2, "slow", 4]]
    # ... and the (simulated) GPU's readings during them, on each worker's own GPU
    busy = pd.read_csv(io.StringIO(ok("tasks", "--gpu", "--format", "csv", "--source", monitored.spool).stdout))
    assert sorted(busy[["job", "prefix", "tasks"]].values.tolist()) == [[1, "slow", 8], [2, "slow", 4]]
    assert (busy["gpu_s"] > 0).all() and busy["mean_utilization_gpu"].between(0, 100).all()
    # a source without task points (tracking `task-stream` off): one line saying why, status 2
    bare = os.path.join(tmp_path, "bare", "20251123T120000-000001", "w0")
    sink = SpoolSink(bare)
    sink.send(lineprotocol.encode_many([p for p in task_points.worker_points(0) if p.measurement in ("gpu", "worker")]))
    sink.close()
    missing = run("tasks", "--source", tmp_path / "bare")
    assert missing.exit_code == 2 and missing.stderr.startswith(
        "error: no task stream recorded: add `task-stream` to tracking"
    )
    missing = run("tasks", "--gpu", "--source", tmp_path / "bare")
    assert missing.exit_code == 2 and missing.stderr.startswith("error: no task stream recorded")


def test_tasks_gpu_per_prefix(tmp_path):
    import task_points

    spool = task_points.write_spool(tmp_path, folders={"agent": task_points.prefix_gpu_points()})
    table = ok("tasks", "--gpu", "--source", spool).stdout.splitlines()
    assert table[0].split() == [
        "job", "prefix", "tasks", "gpu_s", "mean_utilization_gpu", "mean_sm_active",
        "mean_device_utilization_gpu", "mean_device_sm_active", "mean_memory_delta", "max_memory_delta",
    ]  # fmt: skip
    assert [line.split()[:3] for line in table[1:]] == [
        ["1", "mm", "2"],
        ["1", "tiny", "1"],
        ["1", "late", "1"],
        ["2", "hold", "1"],
        ["2", "mm", "1"],
    ]
    rows = json.loads(ok("tasks", "--gpu", "--job", 2, "--per-dag", "--format", "json", "--source", spool).stdout)
    assert [(r["dag"], r["prefix"], round(r["mean_utilization_gpu"], 3)) for r in rows] == [
        (2, "hold", 5.0),
        (2, "mm", 30.0),
    ]
    tasks_only = [p for p in task_points.prefix_gpu_points() if p.measurement == "task"]
    bare = task_points.write_spool(tmp_path / "bare", folders={"w": tasks_only})
    missing = run("tasks", "--gpu", "--source", bare)
    assert missing.exit_code == 2 and missing.stderr.startswith("error: no GPU samples recorded"), missing.stderr
