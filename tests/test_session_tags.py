"""Issue 45: every point of every writer (the host's agent, a worker sampling itself, the scheduler's
dag points, custom metrics, the task stream, activity, delivery counters) names its session: a tag by
default, a string field with ``session-tag: false``; ids are unique and sort by start."""

from __future__ import annotations

import threading

from distributed import Client

from dask_influx_metrics import Monitor, custom_metric, lineparse, names
from dask_influx_metrics.sinks.spool import read_lines

EVERY_WRITER = {"gpu", "host", "worker", "custom", "task", "activity", "dag", "delivery"}


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
