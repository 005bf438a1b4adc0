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
