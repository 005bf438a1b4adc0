"""WorkerExtras: custom metrics and the task stream, as points (thread mode) and as lines (beside the agent)."""

from __future__ import annotations

import types

from dask_influx_metrics import lineprotocol
from dask_influx_metrics.schema import fields_for
from dask_influx_metrics.worker.extras import WorkerExtras
from dask_influx_metrics.worker.taskstream import TaskStream

TAGS = {"host": "h", "worker": "tcp://w:1", "session": "s1"}


class Custom:
    def read(self):
        return [types.SimpleNamespace(tags={"name": "queue depth"}, fields={"value": 3.5})]

    def stop(self):
        pass


def snapshot():
    return types.SimpleNamespace(job_tag="4", dag_tag="9")


def extras(moved=()):
    tasks = TaskStream(fields_for(["task-stream"]), TAGS, field_tags=moved)
    compute = {"action": "compute", "start": 10.0, "stop": 10.5}
    tasks.ended.append((("inc-1", 0), 4, 9, ("memory", "inc", (compute,), 28), 10.6))
    return WorkerExtras(Custom(), tasks, TAGS, snapshot, lambda: 2.0, custom_every=2, field_tags=moved)


def test_lines_are_the_collected_points_written_with_the_field_tags_moved():
    moved = ("dag", "session")
    points, lines = extras(moved).collect(1_000), extras(moved).lines(1_000)
    assert [p.measurement for p in points] == ["custom", "task"]
    assert points[0].time_ns == 2_000_001_000, "custom points on the scheduler's clock"
    assert lines == lineprotocol.encode_many([lineprotocol.tags_as_fields(p, moved) for p in points])
    assert (
        lines[0] == b'custom,host=h,job=4,name=queue\\ depth,worker=tcp://w:1 value=3.5,dag="9",session="s1" 2000001000'
    )


def test_custom_metrics_are_read_on_every_custom_every_th_call_the_task_stream_on_each():
    made = extras()
    assert len(made.lines(0)) == 2
    made.tasks.ended.append((("inc-2", 0), 4, 9, None, 11.0))
    assert [line.split(b",")[0] for line in made.lines(0)] == [b"task"]
    assert [p.measurement for p in made.collect(0)] == ["custom"]
