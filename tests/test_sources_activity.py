import json

from dask_influx_metrics.worker.sources.activity import CachedActivity, TaskRegistry, TaskSource, key_json
from dask_influx_metrics.schema import fields_for


def test_tags_list_running_jobs_and_dags_and_idle_keeps_last_job():
    reg = TaskRegistry(nthreads=4)
    reg.started("a", job=2, dag=5)
    reg.started("b", job=1, dag=3)
    reg.started("c", job=2, dag=5)
    snap = reg.snapshot()
    assert (snap.job_tag, snap.dag_tag, snap.executing) == ("1,2", "3,5", 3)
    for k in "abc":
        reg.finished(k)
    idle = reg.snapshot()
    assert (idle.job_tag, idle.dag_tag) == ("2", "0")


def test_unattributed_tasks_are_counted_but_not_tagged():
    reg = TaskRegistry()
    reg.started("x", job=0, dag=0)
    snap = reg.snapshot()
    assert (snap.executing, snap.job_tag, snap.dag_tag) == (1, "0", "0")


def test_running_keys_survive_any_key_shape():
    keys = [("x-1, 2", 0, 1), 'a "quoted" key', "back\\slash", "new\nline", ("ünïcode", "=")]
    decoded = json.loads(key_json(keys))
    assert decoded == [["x-1, 2", 0, 1], 'a "quoted" key', "back\\slash", "new\nline", ["ünïcode", "="]]


def test_task_source_reads_one_snapshot():
    reg = TaskRegistry(managed_bytes=lambda: 1234)
    reg.started(("k", 1), 1, 1)
    cache = CachedActivity(reg)
    cache.refresh()
    reg.finished(("k", 1))  # after the snapshot: the sample still shows it
    [r] = TaskSource(fields_for(["tasks", "worker-mem"]), cache).read()
    assert r.fields == {"tasks": 1, "running": '[["k", 1]]', "managed_bytes": 1234}


def test_a_task_between_two_samples_is_counted_at_the_next_one_only():
    from dask_influx_metrics.worker.sources.activity import TaskRegistry

    reg = TaskRegistry(nthreads=1)
    reg.snapshot(sample=True)
    assert reg.idle()
    reg.started("short", 1, 7)
    assert not reg.idle()
    reg.finished("short")
    assert reg.idle() and reg.unsampled()
    assert reg.snapshot().dag_tag == "0"  # not a sample (a sidecar publish): not consumed
    at_next = reg.snapshot(sample=True)
    assert (at_next.executing, at_next.job_tag, at_next.dag_tag) == (1, "1", "7")
    assert reg.snapshot(sample=True).dag_tag == "0" and not reg.unsampled()


def test_running_json_follows_the_executing_keys_across_samples():
    reg = TaskRegistry()
    cache = CachedActivity(reg)
    source = TaskSource(fields_for(["tasks"]), cache)
    seen = []
    for step in (lambda: reg.started("a", 1, 1), lambda: None, lambda: reg.started(("b", 0), 1, 1),
                 lambda: reg.finished("a"), lambda: reg.finished(("b", 0))):
        step()
        cache.refresh()
        [r] = source.read()
        seen.append((r.fields["tasks"], r.fields["running"]))
    assert seen == [(1, '["a"]'), (1, '["a"]'), (2, '["a", ["b", 0]]'), (1, '[["b", 0]]'), (0, "[]")]
