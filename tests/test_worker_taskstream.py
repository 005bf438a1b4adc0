"""TaskStream: finished-task records -> task points (fields, tags, times, collisions, tracking)."""

from __future__ import annotations

import random

import pytest

from dask_influx_metrics import lineprotocol
from dask_influx_metrics.schema import TRACKING, fields_for
from dask_influx_metrics.worker.taskstream import TaskStream, wanted

BASE = {"host": "h", "worker": "tcp://w:1", "run": "r"}
STREAM = fields_for(["task-stream"])


def record(key, job=1, dag=2, state="memory", start=100.0, stop=100.5, nbytes=8, extra=(), ended_at=50.0):
    startstops = (*extra, {"action": "compute", "start": start, "stop": stop})
    return (key, job, dag, (state, key.rsplit("-", 1)[0], startstops, nbytes), ended_at)


def test_a_finished_task_becomes_one_point_with_its_job_dag_prefix_state_and_timings():
    stream = TaskStream(STREAM, BASE)
    spent = (
        {"action": "transfer", "start": 99.0, "stop": 99.25, "source": "tcp://x:2"},
        {"action": "disk-read", "start": 99.5, "stop": 99.75},
    )
    stream.ended.append(record("sum-aggregate-3", extra=spent))
    [p] = stream.points(now_ns=1)
    assert p.measurement == "task" and p.time_ns == 100_500_000_000
    assert p.tags == {**BASE, "job": "1", "dag": "2", "prefix": "sum-aggregate", "state": "memory"}
    assert p.fields == {
        "key": "sum-aggregate-3",
        "start": 100.0,
        "duration": 0.5,
        "compute": 0.5,
        "transfer": 0.25,
        "disk_read": 0.25,
        "disk_write": 0.0,
        "nbytes": 8,
    }
    assert not stream.pending() and stream.points(now_ns=2) == []
    assert lineprotocol.encode_many([p])  # the encoder takes every field as typed


def test_states_error_and_cancelled_and_a_task_that_never_ran():
    stream = TaskStream(STREAM, BASE, clock_offset=lambda: 2.0)
    stream.ended.append(record("f-1", state="error", nbytes=None))
    stream.ended.append(record("f-2", state="released"))
    stream.ended.append((("tuple-key", 0), 3, 4, None, 70.0))  # forgotten before its end was read
    points = {p.fields["key"]: p for p in stream.points(now_ns=1)}
    assert points["f-1"].tags["state"] == "error" and "nbytes" not in points["f-1"].fields
    assert points["f-2"].tags["state"] == "cancelled"
    odd = points["('tuple-key', 0)"]
    assert odd.tags["prefix"] == "tuple-key" and odd.tags["state"] == "cancelled"
    assert odd.fields["start"] == 72.0 and odd.fields["duration"] == 0.0 and odd.time_ns == 72_000_000_000


def test_tasks_ending_on_the_same_nanosecond_in_one_series_get_distinct_times():
    stream = TaskStream(STREAM, BASE)
    for i in range(3):
        stream.ended.append(record(f"inc-{i}"))
    stream.ended.append(record("inc-9", job=2))  # another series may share the time
    first = stream.points(now_ns=1)
    stream.ended.append(record("inc-3"))  # next tick, same series, same time
    second = stream.points(now_ns=2)
    times = sorted(p.time_ns for p in first + second if p.tags["job"] == "1")
    assert times == [100_500_000_000 + i for i in range(4)]
    assert [p.time_ns for p in first if p.tags["job"] == "2"] == [100_500_000_000]


def test_tracking_picks_the_fields_and_turns_the_stream_on():
    assert wanted(fields_for(["task-stream"])) and wanted(fields_for(["fine-metrics"]))
    assert not wanted(fields_for(["tasks", "compute-util"]))
    stream = TaskStream(fields_for(["fine-metrics"]), BASE)
    stream.ended.append(record("inc-1"))
    assert stream.points(now_ns=1) == []  # activity only, and Dask added nothing yet
    stream.fine.added.append(("inc", "thread-cpu", "seconds", 0.5))
    [p] = stream.points(now_ns=2)  # the end recorded last tick gets what Dask added after it
    assert (p.tags["job"], p.tags["prefix"], p.fields["value"]) == ("1", "inc", 0.5)
    assert set(TRACKING["task-stream"]) == {("task", n) for n in stream_fields()}


def stream_fields():
    stream = TaskStream(STREAM, BASE)
    stream.ended.append(record("x-1"))
    return stream.points(now_ns=1)[0].fields


def test_field_order_and_sums_with_several_spent_intervals_and_tags_shared_per_series_within_a_tick():
    stream = TaskStream(STREAM, BASE)
    spent = (
        {"action": "disk-write", "start": 1.0, "stop": 1.5},
        {"action": "transfer", "start": 2.0, "stop": 2.25},
        {"action": "compute", "start": 3.0, "stop": 3.5},
        {"action": "transfer", "start": 4.0, "stop": 4.5},
    )
    stream.ended.extend([record("a-1", extra=spent), record("a-2", stop=100.75), record("b-1", dag=3)])
    p1, p2, p3 = sorted(stream.points(now_ns=1), key=lambda p: p.fields["key"])
    assert list(p1.fields) == ["key", "start", "duration", "compute", "transfer", "disk_read", "disk_write", "nbytes"]
    assert (p1.fields["transfer"], p1.fields["disk_write"], p1.fields["duration"]) == (0.75, 0.5, 0.5)  # last compute
    assert p1.tags is p2.tags and p3.tags["dag"] == "3" and p3.tags is not p1.tags  # one dict per series
    stream.ended.append(record("a-3"))
    [p4] = stream.points(now_ns=2)
    assert p4.tags == p1.tags and p4.tags is not p1.tags  # a new tick, new dicts
    only = TaskStream(fields_for([]) | {("task", "duration"), ("task", "key")}, BASE)
    only.ended.append(record("a-1", extra=spent))
    [p] = only.points(now_ns=1)
    assert p.fields == {"key": "a-1", "duration": 0.5}


ODD = [
    "",
    " ",
    "a b",
    "a,b",
    "a=b",
    'a"b',
    "a\\b",
    "a\\",
    "a\\\\",
    "#a",
    "a\nb",
    "a\tb\rc\fd",
    "a\x00b",
    "é\u2603",
    "a\ud800",
    "%s%b%%",
    "time",
]


def odd_records(rng, n, t0=100.0, unwritable=False):
    """Finished-task records with the keys, prefixes and values line protocol has rules for (``unwritable``: and
    values it has none for)."""
    out = []
    for i in range(n):
        key = rng.choice([f"inc-{i}", (rng.choice(ODD), i), rng.choice(ODD) + f"-{i}", ("x", i, rng.choice(ODD))])
        prefix = rng.choice(["inc", "", *ODD])
        start = t0 + rng.choice([0.0, 1e-7, 0.5, 1e6, 1.5e-5]) + i * rng.choice([0.0, 1e-9, 1e-3])
        stop = start + rng.choice([0.0, 1e-7, 2.5e-6, 0.25, 123.456])
        spent = rng.choice(
            [
                (),
                ({"action": "transfer", "start": 1.0, "stop": 1.25},),
                ({"action": "disk-write", "start": 0.0, "stop": 1e-6}, {"action": "disk-read", "start": 3, "stop": 5}),
            ]
            + [({"action": "transfer", "start": 0.0, "stop": float("inf")},)] * unwritable  # the encoder leaves it out
        )
        nbytes = rng.choice([None, 0, 28, -1, 2**53 + 1, 2**63 - 1] + [2**63, 2**64 + 5] * unwritable)
        end = rng.choice(["memory", "error", "released", "cancelled"]), prefix, (*spent, _compute(start, stop)), nbytes
        if rng.random() < 0.05:
            end = None  # forgotten before its end was read
        elif rng.random() < 0.05:
            end = (end[0], end[1], spent, end[3])  # never ran its function
        out.append((key, rng.choice([0, 1, 12]), rng.choice([0, 3]), end, stop + 0.001))
    return out


def _compute(start, stop):
    return {"action": "compute", "start": start, "stop": stop}


def encoded(stream, now_ns, moved):
    return lineprotocol.encode_many([lineprotocol.tags_as_fields(p, moved) for p in stream.points(now_ns)])


@pytest.mark.parametrize("moved", [(), ("dag",), ("dag", "session"), ("session", "dag")])
@pytest.mark.parametrize(
    "tags", [BASE, {"host": "h", "session": 's"1\\', "time": "x", "": "y", "a b": "", "w,x": "=a"}]
)
def test_lines_are_the_encoders_bytes_for_the_points(moved, tags, monkeypatch):
    """The task stream's own line writer against the encoder on the same records, tick after tick (times moved
    on across ticks), with every odd name and value; each case also through the points alone (fields left out)."""
    rng = random.Random(f"{moved}{sorted(tags)}")
    for fields in (STREAM | fields_for(["fine-metrics"]), STREAM - {("task", "compute")}):
        lines, points = (TaskStream(fields, tags, lambda: 0.5, field_tags=moved) for _ in range(2))
        by_points = []
        monkeypatch.setattr(lines, "_points", lambda *a: by_points.append(1) or TaskStream._points(lines, *a))
        for tick in range(8):
            records = odd_records(rng, 150, t0=100.0 + tick * rng.choice([0.0, 0.01]), unwritable=tick % 4 == 3)
            lines.ended.extend(records)
            points.ended.extend(records)
            digests = [(rng.choice(["inc", *ODD]), "thread-cpu", "seconds", 0.5)] * rng.choice([0, 3])
            lines.fine and lines.fine.added.extend(digests)
            points.fine and points.fine.added.extend(digests)
            assert lines.lines(now_ns=tick) == encoded(points, tick, moved)
        every = ("task", "compute") in fields
        assert len(by_points) == (2 if every else 8), "written by the line writer but for the unwritable values"
        assert lines.lines(now_ns=9) == [] == points.points(now_ns=9)


def test_lines_of_plain_tasks_take_no_way_round(monkeypatch):
    """The usual records (no escaping, finite values) are written by the line writer itself: the encoder is
    not called for them, and a new series' text is checked against the encoder once."""
    stream = TaskStream(STREAM, BASE, field_tags=("dag",))
    stream.ended.extend(record(f"inc-{i}", stop=100.5 + i) for i in range(3))
    calls = []
    real = lineprotocol.encode_many
    monkeypatch.setattr(lineprotocol, "encode_many", lambda points: calls.append(len(points)) or real(points))
    first = stream.lines(now_ns=1)
    stream.ended.append(record("inc-3"))
    second = stream.lines(now_ns=2)
    assert calls == [1, 1]  # the series' text checked once, in each shape (with nbytes and without)
    assert first[0] == (
        b"task,host=h,job=1,prefix=inc,run=r,state=memory,worker=tcp://w:1 "
        b'key="inc-0",start=100.0,duration=0.5,compute=0.5,transfer=0.0,disk_read=0.0,disk_write=0.0,nbytes=8i,'
        b'dag="2" 100500000000'
    )
    assert len(first) == 3 and len(second) == 1
