"""Monitor.get_peaks / peak_memory / to_csv / peaks_from_csv / report on a real monitored LocalCluster."""

import os
import pathlib

import pytest

from dask_influx_metrics import Monitor, query


@pytest.fixture(scope="module")
def monitored(monitored_both):
    """Every test here runs on both runs: ``dag-tag`` true and false (conftest.py)."""
    return monitored_both


def test_get_peaks_spool_equals_influxdb(monitored):
    a = monitored.answers
    assert a["peaks_spool"] == a["peaks_influx"]
    assert len(a["peaks_spool"]) == 2 and all(set(w) <= {1, 2} for w in a["peaks_spool"])


def test_peak_memory_is_the_first_apis_shape(monitored):
    peaks = monitored.answers["peak_memory"]
    assert isinstance(peaks, list) and len(peaks) == 2
    assert all(isinstance(w, list) and len(w) == 2 and all(isinstance(v, (int, float)) for v in w) for w in peaks)


def test_query_reuses_one_store_per_session_and_source(monitored):
    assert monitored.answers["store"] == {"reused": True, "other_source_closes_it": True, "shutdown_closes": True}


def test_to_csv_then_peaks_from_csv(monitored):
    paths = monitored.answers["csv"]
    folder = os.path.dirname(paths[0])
    assert (
        [os.path.basename(p) for p in paths]
        == sorted(os.listdir(folder))
        == ["worker_0.csv", "worker_1.csv", "workers.csv"]
    )
    assert Monitor.peaks_from_csv(folder, "compute-util") == monitored.answers["peaks_spool"]
    assert Monitor.peaks_from_csv(folder, "compute-util", workers=[1], per_job=False) == query.get_peaks(
        query.connect(monitored.spool), "compute-util", workers=[1], per_job=False
    )


def test_report_of_the_session(monitored):
    text = pathlib.Path(monitored.answers["report"]).read_text(encoding="utf-8")
    assert '<h2 id="job-1">Job 1</h2>' in text and '<h2 id="job-2">Job 2</h2>' in text
    assert text.count('data-root-id="') == 6  # per job: GPU utilization and memory timelines, activity
