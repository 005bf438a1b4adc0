"""Per-job peaks count a job's own busy samples only (issue 10), in the spool and in InfluxDB.

The data is the H100 scenario (tests/shared_gpu.py): two workers share one GPU;
while worker 0 waits (``dag="0"``, still tagged with its last job 1) its
device-wide readings show job 2's memory and utilization.
"""

import pandas as pd
import pytest
import shared_gpu as S

from dask_influx_metrics import query
from dask_influx_metrics.client import peaks
from dask_influx_metrics.client.query import metricnames


@pytest.fixture(scope="module")
def stores(influxd, tmp_path_factory):
    with S.stores(influxd, tmp_path_factory.mktemp("shared-gpu"), "shared_gpu_peaks") as both:
        yield both


@pytest.mark.parametrize("kind", ["influxql", "spool"])
@pytest.mark.parametrize("server", [True, False])
@pytest.mark.parametrize("metric", sorted(S.EXPECTED))
def test_a_job_is_charged_its_own_busy_samples_only(stores, kind, server, metric):
    got = query.get_peaks(stores[kind], metric, per_job=True, server=server)
    assert got == [{job: [v] for job, v in w.items()} for w in S.EXPECTED[metric]]
    # job 1 was never charged job 2's 21 GiB or 100 % utilization
    assert got[0][1] == [S.EXPECTED[metric][0][1]] and got[0][1] != got[1][2]


@pytest.mark.parametrize("kind", ["influxql", "spool"])
@pytest.mark.parametrize("metric", sorted(S.EXPECTED_WHOLE))
def test_whole_session_peaks_still_use_every_sample(stores, kind, metric):
    assert query.get_peaks(stores[kind], metric, per_job=False) == [[v] for v in S.EXPECTED_WHOLE[metric]]


@pytest.mark.parametrize("kind", ["influxql", "spool"])
@pytest.mark.parametrize("metric", ["total-mem", "worker-gpu-mem", "compute-util", "tasks", "throttle"])
@pytest.mark.parametrize("per_job", [True, False])
def test_server_side_equals_client_side(stores, kind, metric, per_job):
    db = stores[kind]
    server, client = (
        query.peaks(db, metric, per_job=per_job, server=True),
        query.peaks(db, metric, per_job=per_job, server=False),
    )
    assert len(server)
    pd.testing.assert_frame_equal(server, client, check_dtype=False)


def test_one_job_asked_alone(stores):
    for kind, db in stores.items():
        tidy = query.peaks(db, "total-mem", job=1)
        assert tidy[["worker_index", "job", "peak"]].values.tolist() == [[0, 1, 5120 * S.MIB]], kind


def test_the_influxql_peak_query_selects_busy_samples(stores):
    backend, asked = stores["influxql"].backend, []
    real = backend._json
    backend._json = lambda q: asked.append(q) or real(q)
    try:
        query.peaks(stores["influxql"], "compute-util", per_job=True)
        query.peaks(stores["influxql"], "compute-util", per_job=False)
    finally:
        backend._json = real
    per_job, whole = [q for q in asked if q.startswith("SELECT max(")][:: len(S.W)]
    assert "\"dag\" != '0'" in per_job and "dag" not in whole.split("GROUP BY")[0]


def test_byte_metrics_and_an_int_field():
    assert [(m.name, m.unit, m.scale) for m in metricnames.resolve(["worker-gpu-mem", "throttle"])] == [
        ("worker-gpu-mem", "bytes", 2**20),
        ("throttle", "bitmask", 1.0),
    ]


def test_tables_without_busy_samples_have_no_job_peaks():
    t = pd.DataFrame({"job": ["1", "1"], "dag": ["0", "0"], "timestamp": [0.0, 0.5], "x[0]": [5.0, 9.0]})
    t.attrs = {"worker": "tcp://a:1", "worker_index": 0}
    assert peaks.to_lists(peaks.from_tables([t], "x", per_job=True), True, workers=[0]) == [{}]
    assert peaks.to_lists(peaks.from_tables([t], "x", per_job=False), False) == [[9]]


def test_gpus_marks_a_gpu_two_workers_used(influxd, tmp_path):
    """Issue 10: shared GPUs are visible from the data (``Store.gpus()``, CLI ``workers --gpus``)."""
    from click.testing import CliRunner

    from dask_influx_metrics.client.cli import cli

    with S.stores(influxd, tmp_path, "gpus_shared") as stores:
        for name, db in stores.items():
            gpus = db.gpus()
            assert gpus[["worker_index", "uuid", "shared"]].values.tolist() == [
                [0, S.DEVICE["uuid"], True],
                [1, S.DEVICE["uuid"], True],
            ], name
    out = CliRunner().invoke(cli, ["workers", "--gpus", "--format", "csv", "--source", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0] == "host,worker_index,worker,uuid,shared"
    assert out.output.count(",True") == 2
