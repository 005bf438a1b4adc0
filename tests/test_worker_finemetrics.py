"""FineMetrics: deltas of Dask's execute digests per tick, attributed to jobs."""

from __future__ import annotations

import pytest

from dask_influx_metrics.schema import fields_for
from dask_influx_metrics.worker.finemetrics import FineMetrics

BASE = {"host": "h", "worker": "tcp://w:1"}


class Digests(dict):
    def add(self, prefix, activity, value, unit="seconds", span="span-1"):
        key = ("execute", span, prefix, activity, unit)
        self[key] = self.get(key, 0) + value


@pytest.fixture
def digests():
    d = Digests()
    d.add("inc", "thread-cpu", 5.0)  # before monitoring: never reported
    d[("gather-dep", "cancelled", "seconds")] = 1.0  # another context: ignored
    return d


def tick(fine, ended=()):
    return {
        (p.tags["job"], p.tags["prefix"], p.tags["activity"], p.tags["unit"]): (p.fields["value"], p.fields["jobs"])
        for p in fine.points(fine.snapshot(), list(ended), now_ns=7)
    }


def test_one_job_gets_the_whole_delta_and_spans_are_summed(digests):
    fine = FineMetrics(lambda: dict(digests), fields_for(["fine-metrics"]), BASE)
    digests.add("inc", "thread-cpu", 0.5)
    digests.add("inc", "thread-cpu", 0.25, span="span-2")
    digests.add("inc", "disk-write", 1000, unit="bytes")
    digests.add("inc", "my-label", 0.0)  # a zero delta writes nothing
    digests[("gather-dep", "cancelled", "seconds")] = 9.0
    assert tick(fine, [("inc", 3, 0.1), ("inc", 3, 0.2)]) == {
        ("3", "inc", "thread-cpu", "seconds"): (0.75, 1),
        ("3", "inc", "disk-write", "bytes"): (1000.0, 1),
    }
    assert tick(fine) == {}  # nothing changed since


def test_several_jobs_split_by_their_tasks_execution_time(digests):
    fine = FineMetrics(lambda: dict(digests), fields_for(["fine-metrics"]), BASE)
    digests.add("inc", "thread-noncpu", 4.0)
    digests.add("dec", "thread-cpu", 1.0)
    got = tick(fine, [("inc", 1, 0.3), ("inc", 2, 0.1), ("inc", 1, 0.0), ("dec", 2, 0.5)])
    assert got[("1", "inc", "thread-noncpu", "seconds")] == pytest.approx((3.0, 2))
    assert got[("2", "inc", "thread-noncpu", "seconds")] == pytest.approx((1.0, 2))
    assert got[("2", "dec", "thread-cpu", "seconds")] == (1.0, 1) and len(got) == 3


def test_ends_whose_digests_come_a_tick_later_wait_for_them_and_late_digests_follow_the_last_split(digests):
    fine = FineMetrics(lambda: dict(digests), fields_for(["fine-metrics"]), BASE)
    assert tick(fine, [("inc", 4, 0.2)]) == {}  # the end was recorded, Dask adds its digests after
    digests.add("inc", "thread-cpu", 0.2)
    assert tick(fine) == {("4", "inc", "thread-cpu", "seconds"): (pytest.approx(0.2), 1)}
    digests.add("inc", "thread-cpu", 0.1)  # no end recorded for it: the last split of its prefix
    assert tick(fine) == {("4", "inc", "thread-cpu", "seconds"): (pytest.approx(0.1), 1)}
    digests.add("new", "thread-cpu", 0.1)  # never seen: job 0
    assert tick(fine) == {("0", "new", "thread-cpu", "seconds"): (pytest.approx(0.1), 1)}


def test_a_reset_counter_counts_from_zero(digests):
    fine = FineMetrics(lambda: dict(digests), fields_for(["fine-metrics"]), BASE)
    digests[("execute", "span-1", "inc", "thread-cpu", "seconds")] = 0.5  # below the 5.0 seen: Dask restarted
    assert tick(fine, [("inc", 1, 0.5)]) == {("1", "inc", "thread-cpu", "seconds"): (0.5, 1)}


def test_points_carry_the_activity_tags_and_no_dag(digests):
    fine = FineMetrics(lambda: dict(digests), fields_for(["fine-metrics"]), BASE)
    digests.add("inc", "thread-cpu", 1.0)
    [p] = fine.points(fine.snapshot(), [("inc", 2, 1.0)], now_ns=7)
    assert p.measurement == "activity" and p.time_ns == 7
    assert p.tags == {**BASE, "job": "2", "prefix": "inc", "activity": "thread-cpu", "unit": "seconds"}
    assert p.fields == {"value": 1.0, "jobs": 1}
