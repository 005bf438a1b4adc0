"""The job/DAG tag codec: one rule for the worker that writes tags and every reader, query and dashboard."""

import os
import re

import numpy as np
import pandas as pd
import pytest

from dask_influx_metrics import jobtags, lineparse
from dask_influx_metrics.worker.registry import TaskRegistry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAGS = ["0", "1", "2", "12", "1,2", "2,12", "1,12", "3,20,21", "", "x,2"]


@pytest.mark.parametrize(
    "numbers, idle, tag",
    [
        ([2], 0, "2"),
        ([2, 1, 2], 0, "1,2"),
        ([10, 9], 0, "9,10"),
        ([0, None, 3], 0, "3"),
        ([], 0, "0"),
        ([], 4, "4"),
        ((n for n in [5, 5]), 0, "5"),
        ([np.int64(7)], 0, "7"),
    ],
)
def test_format(numbers, idle, tag):
    assert jobtags.format(numbers, idle=idle) == tag


@pytest.mark.parametrize("bad", [[-1], ["2"], [1.5], [True]])
def test_format_rejects_what_is_not_a_number(bad):
    with pytest.raises(ValueError, match=r"a job/DAG number is a non-negative integer, got "):
        jobtags.format(bad)


def test_parse_is_format_reversed():
    for numbers in ([1], [1, 2], [3, 20, 21], list(range(1, 50))):
        assert jobtags.parse(jobtags.format(numbers)) == tuple(numbers)
    assert jobtags.parse("0") == (0,) and jobtags.parse("") == () and jobtags.parse(" 1, 2") == (1, 2)


def test_activity_tags_follow_the_codec():
    reg = TaskRegistry(nthreads=4)
    assert (reg.snapshot().job_tag, reg.snapshot().dag_tag) == ("0", "0")
    for key, job, dag in (("a", 2, 5), ("b", 1, 3), ("c", 2, 5), ("d", 0, 0)):
        reg.started(key, job, dag)
    snap = reg.snapshot()
    assert (snap.job_tag, snap.dag_tag) == (jobtags.format([2, 1, 2]), jobtags.format([5, 3])) == ("1,2", "3,5")
    reg.clear()
    assert (reg.snapshot().job_tag, reg.snapshot().dag_tag) == ("2", "0")  # idle: the job of the last task started (c)


@pytest.mark.parametrize("n", [0, 1, 2, 12, 20])
def test_every_membership_test_agrees(n):
    series = pd.Series(TAGS)
    expected = [n in jobtags.parse(t) for t in TAGS]
    assert [jobtags.contains(t, n) for t in TAGS] == expected
    assert jobtags.series_contains(series, n).tolist() == expected
    exploded = jobtags.explode(pd.DataFrame({"job": TAGS, "row": range(len(TAGS))}), zero=True)
    assert [i in set(exploded.loc[exploded["job"] == n, "row"]) for i in range(len(TAGS))] == expected
    # the query regexes, as Python reads them (InfluxDB's Go regexes agree on this pattern)
    for regex in (jobtags.influxql_regex(n), jobtags.flux_regex(n)):
        assert [bool(re.search(regex.strip("/"), t)) for t in TAGS] == expected


def test_distinct_and_explode_leave_out_zero():
    assert jobtags.distinct(TAGS) == [1, 2, 3, 12, 20, 21]
    assert jobtags.distinct(TAGS, zero=True)[0] == 0
    rows = jobtags.explode(pd.DataFrame({"job": ["1,2", "0", "", "3"], "v": [1.0, 2.0, 3.0, 4.0]}))
    assert rows["job"].tolist() == [1, 2, 3] and rows["v"].tolist() == [1.0, 1.0, 4.0]


def test_regexes_have_the_docs_form():
    readme = ""
    for name in ("monitor.md", "queries.md"):
        with open(os.path.join(ROOT, "docs", name)) as f:
            readme += f.read()
    assert f"job =~ {jobtags.influxql_regex(2)}" in readme  # the "Jobs and DAGs" rule
    assert f'WHERE "job" =~ {jobtags.influxql_regex(2)} AND' in readme  # the ad hoc InfluxQL query
    assert f"r.job =~ {jobtags.flux_regex(2)} and" in readme  # and its Flux twin
    assert jobtags.influxql_regex("$job") == "/(^|,)$job(,|$)/"  # Grafana's variable


@pytest.mark.parametrize("bad", [-2, "2", "job", 1.0, None, True])
def test_regexes_reject_what_is_not_a_number(bad):
    with pytest.raises(ValueError, match="a job/DAG number is a non-negative integer"):
        jobtags.influxql_regex(bad)


def test_influxdb_selects_what_the_codec_selects(monitored):
    """InfluxDB's own regex match of job 2 finds exactly the spooled points the codec says are in job 2."""
    from dask_influx_metrics.sinks.spool import read_lines

    gpu = [p for p in map(lineparse.parse, read_lines(monitored.spool)) if p.measurement == "gpu"]
    for job in (1, 2):
        expected = sum(jobtags.contains(p.tags["job"], job) for p in gpu)
        rows = monitored.influxd.query(
            f'SELECT count("utilization_gpu") FROM "gpu" WHERE "run" = '
            f"'{monitored.run}' AND \"job\" =~ {jobtags.influxql_regex(job)}"
        )
        assert expected > 0 and rows[0]["count"] == expected
