"""TaskSource: the worker measurement's task fields from one activity snapshot; key_json."""

import json

from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.sampling.sources.tasks import TaskSource, key_json
from dask_influx_metrics.schema import fields_for
from dask_influx_metrics.worker.registry import CachedSnapshot, TaskRegistry


def test_running_keys_survive_any_key_shape():
    keys = [("x-1, 2", 0, 1), 'a "quoted" key', "back\\slash", "new\nline", ("ünïcode", "=")]
    decoded = json.loads(key_json(keys))
    assert decoded == [["x-1, 2", 0, 1], 'a "quoted" key', "back\\slash", "new\nline", ["ünïcode", "="]]


def test_task_source_reads_one_snapshot():
    reg = TaskRegistry(managed_bytes=lambda: 1234)
    reg.started(("k", 1), 1, 1)
    cache = CachedSnapshot(reg)
    cache.refresh()
    reg.ended(("k", 1))  # after the snapshot: the sample still shows it
    fields = TaskSource(fields_for(["tasks", "worker-mem"]), cache).read()
    assert fields == {"tasks": 1, "running": '[["k", 1]]', "managed_bytes": 1234}


def test_running_json_follows_the_executing_keys_across_samples():
    reg = TaskRegistry()
    cache = CachedSnapshot(reg)
    source = TaskSource(fields_for(["tasks"]), cache)
    seen = []
    for step in (
        lambda: reg.started("a", 1, 1),
        lambda: None,
        lambda: reg.started(("b", 0), 1, 1),
        lambda: reg.ended("a"),
        lambda: reg.ended(("b", 0)),
    ):
        step()
        cache.refresh()
        fields = source.read()
        seen.append((fields["tasks"], fields["running"]))
    assert seen == [(1, '["a"]'), (1, '["a"]'), (2, '["a", ["b", 0]]'), (1, '[["b", 0]]'), (0, "[]")]


def test_keys_a_full_snapshot_left_out_are_counted_but_not_listed():
    snap = Snapshot(((None, 1, 1), ("a", 1, 1)), 2, 0, 1)  # None: a key dropped to fit the buffer
    fields = TaskSource(fields_for(["tasks"]), lambda: snap).read()
    assert (fields["tasks"], fields["running"]) == (2, '["a"]')


def test_no_task_fields_wanted_reads_nothing():
    def never():
        raise AssertionError("the snapshot was read")

    assert TaskSource(frozenset({("host", "cpu_percent"), ("worker", "rss")}), never).read() == {}
