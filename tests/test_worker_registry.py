"""TaskRegistry and CachedSnapshot: what the worker is doing, as an in-process sampler sees it."""

from dask_influx_metrics.worker.registry import CachedSnapshot, TaskRegistry


def test_tags_list_running_jobs_and_dags_and_idle_keeps_last_job():
    reg = TaskRegistry(nthreads=4)
    reg.started("a", job=2, dag=5)
    reg.started("b", job=1, dag=3)
    reg.started("c", job=2, dag=5)
    snap = reg.snapshot()
    assert (snap.job_tag, snap.dag_tag, snap.executing) == ("1,2", "3,5", 3)
    for k in "abc":
        reg.ended(k)
    idle = reg.snapshot()
    assert (idle.job_tag, idle.dag_tag) == ("2", "0")


def test_unattributed_tasks_are_counted_but_not_tagged():
    reg = TaskRegistry()
    reg.started("x", job=0, dag=0)
    snap = reg.snapshot()
    assert (snap.executing, snap.job_tag, snap.dag_tag) == (1, "0", "0")


def test_a_task_between_two_samples_is_counted_at_the_next_one_only():
    reg = TaskRegistry(nthreads=1)
    reg.snapshot(sample=True)
    assert reg.idle()
    reg.started("short", 1, 7)
    assert not reg.idle()
    reg.ended("short")
    assert reg.idle() and reg.unsampled()
    assert reg.snapshot().dag_tag == "0"  # not a sample (a publish): not consumed
    at_next = reg.snapshot(sample=True)
    assert (at_next.executing, at_next.job_tag, at_next.dag_tag) == (1, "1", "7")
    assert reg.snapshot(sample=True).dag_tag == "0" and not reg.unsampled()


def test_without_an_in_process_sampler_brief_tasks_are_not_kept():
    reg = TaskRegistry(brief=False)  # the agent samples: the published snapshot carries them instead
    reg.started("short", 1, 7)
    assert reg.ended("short") == (1, 7)
    assert not reg.unsampled() and reg.snapshot(sample=True).executing == 0


def test_cached_activity_is_one_snapshot_per_sample():
    reg = TaskRegistry(managed_bytes=lambda: 1234)
    cache = CachedSnapshot(reg)
    reg.started(("k", 1), 1, 1)
    assert cache().executing == 0  # not refreshed yet
    cache.refresh()
    reg.ended(("k", 1))  # after the snapshot: the sample still shows it
    assert (cache().executing, cache().managed_bytes) == (1, 1234)
