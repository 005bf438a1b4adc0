"""docs/queries.md ("Ad hoc queries"): every InfluxQL query runs, as written, on data from a monitored cluster.

The ``monitored`` fixture (conftest.py) ran a real ``LocalCluster`` with two workers (simulated
GPUs) and two manual jobs, one DAG each, into the session influxd's ``dask_metrics`` database.
Queries run unchanged (their own ``time > now() - 1h`` window) and must return rows; a query that
groups by ``worker``, ``job`` or ``dag`` must have a row for each of that run's workers, jobs 1
and 2, DAGs 1 and 2. The Flux twins are checked in test_flux.py (they need InfluxDB 2 to run).
"""

from __future__ import annotations

import os
import re

import pytest
from fluxcheck import ROOT, fenced_blocks

with open(os.path.join(ROOT, "docs", "queries.md")) as _f:
    _README = _f.read()
SECTION = _README
QUERIES = fenced_blocks(_README, "influxql")


def _grouped_by(query: str) -> set[str]:
    group = query.rsplit("GROUP BY", 1)[1] if "GROUP BY" in query else ""
    return set(re.findall(r'"(\w+)"', group))


@pytest.fixture(scope="module")
def monitored(monitored_both):
    """Every test here runs on both runs: ``dag-tag`` true and false (conftest.py)."""
    return monitored_both


def test_section_has_queries_in_both_languages():
    assert _README.startswith("# Ad hoc queries\n")
    assert len(fenced_blocks(SECTION, "influxql")) >= 6 and len(fenced_blocks(SECTION, "flux")) >= 6
    assert all(";" not in q for _, q in QUERIES), "one statement per block"


@pytest.mark.parametrize("query", [q for _, q in QUERIES], ids=[f"docs/queries.md:{line}" for line, _ in QUERIES])
def test_influxql_query_returns_rows(monitored, query):
    if "dag" in _grouped_by(query) and not monitored.dag_tag:
        pytest.skip("InfluxQL cannot GROUP BY a field: this query is for dag-tag: true (docs/queries.md)")
    rows = monitored.influxd.query(query.strip(), db=monitored.database)
    assert rows, f"no rows for {query}"
    assert all(v is not None for row in rows for v in row.values()), rows[:5]
    expected = {"worker": set(monitored.workers), "job": {"1", "2"}, "dag": {"1", "2"}}
    for tag in _grouped_by(query) & set(expected):
        assert expected[tag] <= {row[tag] for row in rows}, (tag, rows)
