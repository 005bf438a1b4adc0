"""FineMetrics: what Dask's execute digests added per tick, attributed to jobs."""

from __future__ import annotations

import pytest

from dask_influx_metrics.schema import fields_for
from dask_influx_metrics.worker.finemetrics import FineMetrics

BASE = {"host": "h", "worker": "tcp://w:1"}


@pytest.fixture
def fine():
    return FineMetrics(fields_for(["fine-metrics"]), BASE)


def add(fine, prefix, activity, amount, unit="seconds"):
    """What the worker plugin's tap appends when Dask digests ("execute", span, prefix, activity, unit)."""
    fine.added.append((prefix, activity, unit, amount))


def tick(fine, ended=()):
    return {
        (p.tags["job"], p.tags["prefix"], p.tags["activity"], p.tags["unit"]): (p.fields["value"], p.fields["jobs"])
        for p in fine.points(fine.take(), list(ended), now_ns=7)
    }


def test_one_job_gets_the_whole_amount_and_spans_are_summed(fine):
    add(fine, "inc", "thread-cpu", 0.5)
    add(fine, "inc", "thread-cpu", 0.25)  # the same prefix in another span
    add(fine, "inc", "disk-write", 1000, unit="bytes")
    add(fine, "inc", "my-label", 0.0)  # nothing added writes nothing
    assert tick(fine, [("inc", 3, 0.1), ("inc", 3, 0.2)]) == {
        ("3", "inc", "thread-cpu", "seconds"): (0.75, 1),
        ("3", "inc", "disk-write", "bytes"): (1000.0, 1),
    }
    assert not fine.pending() and tick(fine) == {}  # nothing added since


def test_several_jobs_split_by_their_tasks_execution_time(fine):
    add(fine, "inc", "thread-noncpu", 4.0)
    add(fine, "dec", "thread-cpu", 1.0)
    got = tick(fine, [("inc", 1, 0.3), ("inc", 2, 0.1), ("inc", 1, 0.0), ("dec", 2, 0.5)])
    assert got[("1", "inc", "thread-noncpu", "seconds")] == pytest.approx((3.0, 2))
    assert got[("2", "inc", "thread-noncpu", "seconds")] == pytest.approx((1.0, 2))
    assert got[("2", "dec", "thread-cpu", "seconds")] == (1.0, 1) and len(got) == 3


def test_ends_whose_digests_come_a_tick_later_wait_for_them_and_late_digests_follow_the_last_split(fine):
    assert tick(fine, [("inc", 4, 0.2)]) == {}  # the end was recorded, Dask adds its digests after
    assert fine.pending()
    add(fine, "inc", "thread-cpu", 0.2)
    assert tick(fine) == {("4", "inc", "thread-cpu", "seconds"): (pytest.approx(0.2), 1)}
    add(fine, "inc", "thread-cpu", 0.1)  # no end recorded for it: the last split of its prefix
    assert tick(fine) == {("4", "inc", "thread-cpu", "seconds"): (pytest.approx(0.1), 1)}
    add(fine, "new", "thread-cpu", 0.1)  # never seen: job 0
    assert tick(fine) == {("0", "new", "thread-cpu", "seconds"): (pytest.approx(0.1), 1)}


def test_points_carry_the_activity_tags_and_no_dag(fine):
    add(fine, "inc", "thread-cpu", 1.0)
    [p] = fine.points(fine.take(), [("inc", 2, 1.0)], now_ns=7)
    assert p.measurement == "activity" and p.time_ns == 7
    assert p.tags == {**BASE, "job": "2", "prefix": "inc", "activity": "thread-cpu", "unit": "seconds"}
    assert p.fields == {"value": 1.0, "jobs": 1}


def test_a_take_leaves_what_is_appended_meanwhile_to_the_next(fine):
    add(fine, "inc", "thread-cpu", 1.0)
    taken = fine.take()
    add(fine, "inc", "thread-cpu", 2.0)  # the event loop, between the take and the points
    assert [a for *_, a in taken] == [1.0] and [a for *_, a in fine.take()] == [2.0]
