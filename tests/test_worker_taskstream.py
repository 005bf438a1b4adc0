"""TaskStream: finished-task records -> task points (fields, tags, times, collisions, tracking)."""

from __future__ import annotations

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
