"""What the readers say when they cannot answer: one line naming where they looked and what is there."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dask_influx_metrics import lineprotocol, query
from dask_influx_metrics.client.cli import cli
from dask_influx_metrics.schema import Point

W = "tcp://10.0.0.1:1"
T0 = 1_714_564_800_000_000_000  # 2024-05-01T12:00:00Z


@pytest.fixture
def db(influxd, fresh_db) -> str:
    tags = {"host": "h", "worker": W, "job": "1", "dag": "1", "run": "nightly"}
    points = [Point("gpu", {**tags, "index": "0"}, {"utilization_gpu": 5.0 * k}, T0 + k * 10**9) for k in range(3)]
    points.append(Point("host", tags, {"cpu_percent": 1.0}, T0))
    influxd.write(b"\n".join(lineprotocol.encode_many(points)), db=fresh_db)
    return fresh_db


def _cli(*args):
    return CliRunner().invoke(cli, list(args))


def test_tags_that_match_nothing(influxd, db):
    where = f"in database '{db}' at {influxd.url}, at any time, tags {{'run': 'nope'}}"
    there = "the source holds samples from 2024-05-01T12:00:00Z to 2024-05-01T12:00:02Z, run in ['nightly']"
    with query.connect(influxd.url, db, tags={"run": "nope"}) as store:
        assert store.workers() == [] and store.metrics() == [] and store.jobs() == []
        with pytest.raises(query.QueryError) as info:
            query.worker_tables(store)
    assert str(info.value) == f"no worker samples {where}; {there}"
    for command, what in (("workers", "worker samples"), ("jobs", "jobs"), ("metrics", "metrics"), ("dags", "DAGs")):
        result = _cli(command, "--source", influxd.url, "--database", db, "--tag", "run=nope")
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr == f"error: no {what} {where}; {there}\n"


def test_a_window_that_matches_nothing(influxd, db):
    result = _cli("export", "out", "--source", influxd.url, "--database", db, "--start", "2025-01-01T00:00:00Z")
    assert result.exit_code == 2
    assert result.stderr.endswith(
        f"error: no worker samples in database '{db}' at {influxd.url} from "
        "2025-01-01T00:00:00Z; the source holds samples from 2024-05-01T12:00:00Z "
        "to 2024-05-01T12:00:02Z\n"
    )


def test_metrics_answer_for_the_window(influxd, db):
    with query.connect(influxd.url, db, start=(T0 + 10**9) / 1e9) as store:
        assert store.metrics() == ["compute-util"]  # host-cpu was sampled before the window only
        with pytest.raises(
            ValueError,
            match=r"\['host-cpu'\] were not collected; present: \['compute-util'\] "
            r"\(in database .* from 2024-05-01T12:00:01Z\)",
        ):
            query.peaks(store, "host-cpu")


def test_an_unknown_metric_lists_the_metrics_present(influxd, db):
    with query.connect(influxd.url, db) as store, pytest.raises(ValueError) as info:
        query.worker_tables(store, metrics=["gpu-magic"])
    assert str(info.value).startswith(
        f"unknown metric(s) ['gpu-magic']; present in database '{db}' at "
        f"{influxd.url}, at any time: ['compute-util', 'host-cpu'] (known: "
    )
    assert "'mem-util'" not in str(info.value)  # not the 34 names the package knows


@pytest.mark.parametrize(
    "source, hint",
    [
        ("127.0.0.1:8086", "'http://127.0.0.1:8086'"),
        ("influx.example:8086/", "'http://influx.example:8086/'"),
        ("influxdb://h:8086", "http:// or https://, not influxdb://"),
    ],
)
def test_a_source_without_scheme(source, hint):
    message = f"spool folder {source!r} does not exist; for InfluxDB write the URL with its scheme: {hint}"
    with pytest.raises(query.QueryError) as info:
        query.connect(source)
    assert str(info.value) == message
    result = _cli("jobs", "--source", source)
    assert result.exit_code == 2 and result.stderr == f"error: {message}\n"


def test_flux_against_a_server_without_flux(influxd):
    pytest.importorskip("influxdb_client")
    with pytest.raises(query.QueryError) as info:
        query.connect(influxd.url, "dask_metrics", language="flux", timeout=5)
    assert str(info.value).startswith(
        f"InfluxDB at {influxd.url} does not answer Flux (/api/v2/query: 404 page "
        "not found): InfluxDB 1.x answers Flux from 1.8 on, with flux-enabled = true"
    )
    result = _cli("jobs", "--source", influxd.url, "--language", "flux")
    assert result.exit_code == 2 and "b'404" not in result.stderr and "--language influxql" in result.stderr


def test_lines_influxdb_refused_are_named_never_as_no_gpu(influxd, fresh_db, tmp_path):
    """Issue 33 item 4: a foreign string ``utilization_gpu`` (same shard, before the session) makes
    InfluxDB refuse every GPU line of the session (HTTP 400, field type conflict); the HTTP sink keeps them
    under ``refused/``. A reader of the session's range finds no GPU samples and says that InfluxDB
    refused them, why and where they are, not that the workers had no GPU; likewise for samples kept
    only in ``undelivered/``."""
    from dask_influx_metrics.sinks.http import HttpOptions, HttpSink
    from dask_influx_metrics.sinks.spool import SpoolSink

    influxd.write(b'gpu,host=other utilization_gpu="foreign" %d' % (T0 - 3600 * 10**9), db=fresh_db)
    session = tmp_path / "20240501T120000-000001"
    refused = session / "agent-h" / "refused"
    tags = {"host": "h", "worker": W, "job": "1", "dag": "1"}
    gpu = [Point("gpu", {**tags, "index": "0", "uuid": "GPU-1"}, {"utilization_gpu": 50.0}, T0 + k) for k in range(4)]
    host = [Point("host", tags, {"cpu_percent": 10.0}, T0 + k) for k in range(4)]
    sink = HttpSink(influxd.url, fresh_db, HttpOptions(flush_interval=0.01), refused=refused)
    sink.send(lineprotocol.encode_many(gpu + host))
    sink.close()
    assert (sink.points_written, sink.points_refused) == (4, 4)
    with query.connect(influxd.url, database=fresh_db, start=T0 / 1e9, undelivered=session) as db:
        with pytest.raises(ValueError) as e:
            query.get_peaks(db, "compute-util")
        assert query.gpu_during_tasks(db).attrs["why"].startswith("InfluxDB refused 4 line(s) of gpu/utilization_gpu")
    message = str(e.value)
    assert "InfluxDB refused 4 line(s) of gpu/utilization_gpu" in message and str(refused) in message
    assert 'field type conflict: input field "utilization_gpu" on measurement "gpu"' in message
    assert "no GPU" not in message, message

    undelivered = SpoolSink(session / "agent-h" / "undelivered")
    undelivered.send(lineprotocol.encode_many(Point("gpu", p.tags, {"memory_used": 10.0}, p.time_ns) for p in gpu))
    undelivered.close()
    with query.connect(influxd.url, database=fresh_db, start=T0 / 1e9, undelivered=session) as db:
        with pytest.raises(ValueError, match=r"4 line\(s\) of gpu/memory_used are only in the undelivered copy at "):
            query.get_peaks(db, "total-mem")
        with pytest.raises(ValueError, match=r"InfluxDB refused 4 line\(s\) of gpu/utilization_gpu"):
            query.to_csv(db, tmp_path / "csv", metrics=["compute-util"])
    with query.connect(influxd.url, database=fresh_db, start=T0 / 1e9) as db:  # no copy named: as before
        with pytest.raises(ValueError, match="the workers reported no GPU"):
            query.get_peaks(db, "compute-util")
