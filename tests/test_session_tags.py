"""Issue 45: every point of every writer (the host's agent, a worker sampling itself, the scheduler's
dag points, custom metrics, the task stream, activity, delivery counters) names its session: a tag by
default, a string field with ``session-tag: false``; ids are unique and sort by start."""

from __future__ import annotations

import threading

from distributed import Client

from dask_influx_metrics import Monitor, custom_metric, lineparse, names
from dask_influx_metrics.sinks.spool import read_lines

EVERY_WRITER = {"gpu", "host", "disk", "worker", "custom", "task", "activity", "dag", "delivery", "accounting"}


@custom_metric("one", per_device=False)
def one(worker, handles):
    return 1.0


def slow(x):
    threading.Event().wait(0.2)
    return x


def _session(client, spool, **settings) -> tuple[str, list]:
    m = Monitor(client, sink="spool", spool_directory=str(spool), gpu_source="simulated", **settings)
    m.attach(polling_interval=50, custom_metrics=[one])
    sid = m.start()["id"]
    try:
        assert client.gather(client.map(slow, range(4))) == list(range(4))
    finally:
        m.stop()
        m.shutdown()
    return sid, [lineparse.parse(line) for line in read_lines(spool / sid)]


def test_every_writer_tags_its_points_with_the_session(cluster, tmp_path):
    with Client(cluster) as client:
        sid, points = _session(client, tmp_path)
        assert {p.measurement for p in points} == EVERY_WRITER
        assert {p.tags.get("session") for p in points} == {sid}
        assert not any("session" in p.fields for p in points)

        # thread mode, and the field instead of the tag: the same for every writer
        sid2, points = _session(client, tmp_path, sampler_mode="thread", session_tag=False)
        assert {p.measurement for p in points} == EVERY_WRITER
        assert {p.fields.get("session") for p in points} == {sid2}
        assert not any("session" in p.tags for p in points)
    assert sid < sid2 and names.session_start_ns(sid) < names.session_start_ns(sid2)


def test_session_ids_differ_within_one_microsecond_and_fit_40_bytes_a_line():
    ids = {names.new_session_id(1795255200.0) for _ in range(1000)}
    assert len(ids) == 1000
    assert {len(f",session={i}") for i in ids} == {38} and {len(f',session="{i}"') for i in ids} == {40}


def test_two_real_sessions_in_one_fresh_influxdb(cluster, influxd, tmp_path):
    """The issue's case end to end: two monitoring sessions over HTTP into one database nobody created. Every
    reader, the CLI too, reads the latest only and says so; session= reaches the other; no DAG row mixes them."""
    import uuid

    from click.testing import CliRunner

    from dask_influx_metrics import query
    from dask_influx_metrics.client.cli import cli

    database = "two_" + uuid.uuid4().hex[:8]
    ids = []
    with Client(cluster) as client:
        for n in (4, 2):  # the first session runs 4 tasks in 2 DAGs, the second 2 in 1
            m = Monitor(client, sink="http", influxdb_url=influxd.url, database=database, gpu_source="simulated")
            m.attach(polling_interval=50, tracking=["compute-util", "tasks"], job_type="manual")
            ids.append(m.start()["id"])
            try:
                for _ in range(n // 2):
                    m.new_job()
                    client.gather(client.map(slow, range(2), pure=False))
            finally:
                m.stop()
                m.shutdown()
    with query.connect(influxd.url, database) as db:
        assert db.jobs() == [1] and list(db.dags()["session"]) == [ids[1]] and len(db.workers()) == 2
        assert f"read session {ids[1]!r}, the latest of 2" in db.notes[0] and ids[0] in db.notes[0]
        assert db.sessions()[["index", "session", "jobs"]].values.tolist() == [[1, ids[1], 1], [2, ids[0], 2]]
    with query.connect(influxd.url, database, session=2) as db:
        assert db.jobs() == [1, 2] and list(db.dags()["session"]) == [ids[0]] * 2
    with query.connect(influxd.url, database, session="all") as db:
        dags = db.dags()
        assert list(zip(dags["session"], dags["job"])) == [(ids[0], 1), (ids[0], 2), (ids[1], 1)]
        assert (dags["ended"] > dags["submitted"]).all()
    run = CliRunner().invoke(cli, ["dags", "--source", influxd.url, "--database", database, "--format", "csv"])
    assert run.exit_code == 0 and ids[1] in run.stdout and ids[0] not in run.stdout and "latest of 2" in run.stderr
    run = CliRunner().invoke(cli, ["jobs", "--source", influxd.url, "--database", database, "--session", ids[0]])
    assert run.exit_code == 0 and run.stdout.split() == ["1", "2"]
