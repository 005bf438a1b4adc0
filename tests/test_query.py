"""The query module on data from a real monitored LocalCluster: influxd (InfluxQL) and the spool agree."""

import pandas as pd
import pytest

from dask_influx_metrics import query
from dask_influx_metrics.query import QueryError

METRICS = ["compute-util", "mem-util", "total-mem", "host-cpu", "tasks"]


@pytest.fixture(scope="module")
def monitored(monitored_both):
    """Every test here runs on both runs: ``dag-tag`` true and false (conftest.py)."""
    return monitored_both


@pytest.fixture(scope="module")
def stores(monitored):
    influx = query.connect(monitored.influxd.url, database=monitored.database, tags={"run": monitored.run})
    spool = query.connect(monitored.spool)
    # one clock for both: the collection start as the spool sees it
    origin = spool.origin_ns
    influx = query.connect(
        monitored.influxd.url,
        database=monitored.database,
        tags={"run": monitored.run},
        start=pd.Timestamp(origin, unit="ns", tz="UTC"),
    )
    return {"influxql": influx, "spool": spool}


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_what_exists(stores, monitored, kind):
    db = stores[kind]
    assert db.workers() == monitored.workers
    assert db.worker_map() == dict(enumerate(monitored.workers))
    assert db.jobs() == [1, 2]
    dags = db.dags()
    assert list(dags["dag"]) == [1, 2] and list(dags["job"]) == [1, 2]
    assert set(dags["status"]) == {"ok"} and (dags["duration"] > 0).all()
    assert list(db.dags(job=2)["dag"]) == [2]
    assert {"compute-util", "mem-util", "total-mem", "tasks", "host-cpu"} <= set(db.metrics())


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_worker_tables(stores, monitored, kind):
    tables = query.worker_tables(stores[kind], metrics=METRICS)
    assert list(tables) == monitored.workers
    for i, (worker, t) in enumerate(tables.items()):
        assert t.attrs["worker"] == worker and t.attrs["worker_index"] == i
        assert isinstance(t.index, pd.DatetimeIndex) and str(t.index.tz) == "UTC"
        assert t.index.is_monotonic_increasing
        assert list(t.columns[:5]) == ["job", "dag", "timestamp", "tasks", "running"]
        for m in ("compute-util", "mem-util", "total-mem"):
            assert [c for c in t.columns if c.startswith(m + "[")] == [f"{m}[0]", f"{m}[1]"]
        assert "host-cpu" in t.columns
        assert (t["timestamp"] >= 0).all()
        assert t["total-mem[0]"].max() > 0
        busy = t[t["dag"] != "0"]
        assert len(busy) and (busy["tasks"] > 0).all()
        assert set(t["job"]) <= {"0", "1", "2", "1,2"}


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_the_host_is_written_once_and_every_table_shows_it(stores, kind):
    """Default settings (sampler.host-once): 2 worker processes on one host write ONE host series (one writer
    while the jobs ran; another worker may take over only while the first tears down), and every worker's
    table holds its host's readings: each row the last one at or before it."""
    db = stores[kind]
    (host,) = set(db.hosts().values())
    series = db.host_series(host, ["cpu_percent"]).sort_values("time")
    assert series["time"].is_unique, "never two host readings of one instant"
    ended = db.dags()["ended"].max().value
    assert series.loc[series["time"] <= ended, "worker"].nunique() == 1, "one writer while the jobs ran"
    writers = series["worker"]
    assert int((writers != writers.shift()).sum()) <= 2, "at most one takeover, never interleaved"
    values = series.set_index("time")["cpu_percent"]
    for worker, table in query.worker_tables(db, metrics=["host-cpu", "tasks"]).items():
        held = table["host-cpu"].dropna()
        assert len(held) >= 0.8 * len(table), f"{worker}: {len(held)} of {len(table)} rows have host columns"
        times = table.index.as_unit("ns").asi8
        for t, v in zip(times, table["host-cpu"]):
            if v == v:  # not NaN
                assert v == values[values.index <= t].iloc[-1], (worker, t)


def test_spool_and_influx_give_the_same_tables(stores):
    a = query.worker_tables(stores["influxql"], metrics=METRICS)
    b = query.worker_tables(stores["spool"], metrics=METRICS)
    for worker in a:
        pd.testing.assert_frame_equal(a[worker], b[worker], check_dtype=False)


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_job_filter(stores, kind):
    tables = query.worker_tables(stores[kind], job=2, metrics=["compute-util"])
    for t in tables.values():
        assert len(t) and t["job"].str.split(",").apply(lambda js: "2" in js).all()


@pytest.mark.parametrize("kind", ["influxql", "spool"])
@pytest.mark.parametrize("metric", ["compute-util", "total-mem", "host-cpu", "tasks"])
@pytest.mark.parametrize("per_job", [True, False])
def test_peaks_server_side_equal_client_side(stores, kind, metric, per_job):
    db = stores[kind]
    server = query.peaks(db, metric, per_job=per_job, server=True)
    client = query.peaks(db, metric, per_job=per_job, server=False)
    assert len(server)
    pd.testing.assert_frame_equal(server, client, check_dtype=False)


def test_get_peaks_shapes(stores, monitored):
    db = stores["influxql"]
    per_job = query.get_peaks(db, "compute-util", per_job=True)
    assert isinstance(per_job, list) and len(per_job) == len(monitored.workers)
    for worker in per_job:
        assert set(worker) <= {1, 2} and worker
        for peaks in worker.values():
            assert len(peaks) == 2 and all(isinstance(v, (int, float)) for v in peaks)
    flat = query.get_peaks(db, "compute-util", per_job=False, workers=[1])
    assert isinstance(flat, list) and len(flat) == 1 and len(flat[0]) == 2
    assert flat[0] == [max(job[d] for job in per_job[1].values()) for d in range(2)] or all(
        f >= max(job[d] for job in per_job[1].values()) for d, f in enumerate(flat[0])
    )
    assert query.get_peaks(stores["spool"], "compute-util", per_job=True) == per_job


def test_total_mem_is_bytes(stores):
    tidy = query.peaks(stores["influxql"], "total-mem", per_job=False)
    mib = query.peaks(stores["influxql"], "gpu.memory_used", per_job=False)
    assert list(tidy["peak"]) == [v * 2**20 for v in mib["peak"]]
    assert set(tidy["unit"]) == {"bytes"} and set(mib["unit"]) == {"MiB"}


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_summary(stores, kind):
    s = query.summary(stores[kind])
    assert set(s["resource"]) == {"gpu", "cpu", "memory", "disk", "network"}  # tracking=None: every metric
    whole = s[s["job"].isna() & (s["resource"] == "gpu")]
    mine, every = whole[whole["worker_index"].notna()], whole[whole["worker"] == "all workers"]
    assert len(mine) == 2 and (mine["devices"] == 2).all()
    assert ((whole["unused_device_hours"] >= 0) & (whole["unused_device_hours"] <= whole["device_hours"])).all()
    # simulated GPUs are each worker's own: counting each physical GPU once adds the workers' figures up
    assert every["devices"].tolist() == [4] and every["device_hours"].sum() == pytest.approx(mine["device_hours"].sum())
    shares = s.dropna(subset=["above_20"])  # network rows have no level to share out
    assert ((shares["above_20"] >= shares["above_40"]) & (shares["above_40"] >= shares["above_80"])).all()
    assert set(s["job"].dropna()) == {1, 2}


def test_node_rows_read_alike_from_influxdb_and_the_spool(stores):
    """Issue 47: cpu, memory, disk and network rows, the disk measurement's usage included."""
    node = [query.summary(stores[k]).query("resource != 'gpu'").reset_index(drop=True) for k in ("influxql", "spool")]
    pd.testing.assert_frame_equal(*node, check_dtype=False)
    disk = node[0][node[0]["resource"] == "disk"]
    assert (disk["max"] > 0).all() and (disk["write_bytes"] >= 0).all()
    cpu = node[0][node[0]["resource"] == "cpu"]
    assert (cpu["core_max"] >= cpu["core_min"]).all() and (cpu["devices"] > 0).all()


def test_bad_questions_name_what_exists(stores):
    db = stores["influxql"]
    with pytest.raises(ValueError, match=r"no job 7; jobs: \[1, 2\]"):
        query.worker_tables(db, job=7)
    with pytest.raises(ValueError, match="no worker 5; workers: "):
        query.worker_tables(db, workers=[5])
    with pytest.raises(ValueError, match="unknown metric.*'gpu-magic'.*known: "):
        query.worker_tables(db, metrics=["gpu-magic"])
    with pytest.raises(ValueError, match="several fields; name one: .*'host.memory_used'"):
        query.peaks(db, "host-mem")


def test_metric_not_collected(tmp_path):
    folder = tmp_path / "20260101T000000-000001" / "tcp___127.0.0.1_1"
    folder.mkdir(parents=True)
    (folder / "spool-1-000000.lp").write_text(
        'gpu,host=h,worker=tcp://127.0.0.1:1,job=1,dag=1,index=0 utilization_gpu=50 1000000000\n'
        'gpu,host=h,worker=tcp://127.0.0.1:1,job=1,dag=1,index=0 utilization_gpu=70 1200000000\n'
    )
    db = query.connect(tmp_path)
    assert db.metrics() == ["compute-util"]
    with pytest.raises(ValueError, match=r"\['power'\] were not collected; present: \['compute-util'\]"):
        query.worker_tables(db, metrics=["power"])
    assert query.get_peaks(db, "compute-util") == [{1: [70]}]
    t = query.worker_tables(db)["tcp://127.0.0.1:1"]
    assert list(t["timestamp"]) == [0.0, 0.2] and list(t["compute-util[0]"]) == [50, 70]


def test_unreachable_and_unknown_database(influxd, tmp_path):
    with pytest.raises(QueryError, match=r"cannot reach InfluxDB at http://127\.0\.0\.1:1"):
        query.connect("http://127.0.0.1:1", timeout=2)
    with pytest.raises(QueryError, match=r"database 'nope' not found at .*; databases: \["):
        query.connect(influxd.url, database="nope")
    with pytest.raises(QueryError, match="no spooled samples under"):
        query.connect(tmp_path)


def _open_pools(db) -> int:
    return sum(len(adapter.poolmanager.pools) for adapter in db.backend._session.adapters.values())


def test_store_as_context_manager_closes_its_connections(monitored):
    with query.connect(monitored.influxd.url, database=monitored.database, tags={"run": monitored.run}) as db:
        assert db.jobs() == [1, 2]
        assert _open_pools(db) == 1 and not db.closed  # the requests.Session holds a connection
    assert db.closed and _open_pools(db) == 0
    db.close()  # twice is harmless
    with query.connect(monitored.spool) as spool:
        assert spool.jobs() == [1, 2]
    assert spool.closed


def test_csv_round_trip(stores, monitored, tmp_path):
    from dask_influx_metrics.client import csvfiles

    db = stores["influxql"]
    paths = query.to_csv(db, tmp_path, metrics=METRICS)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["worker_0.csv", "worker_1.csv", "workers.csv"]
    manifest = pd.read_csv(tmp_path / "workers.csv")
    assert list(manifest["worker"]) == monitored.workers
    tables = query.worker_tables(db, metrics=METRICS)
    for i, (worker, t) in enumerate(tables.items()):
        back = csvfiles.read_worker_csv(tmp_path / f"worker_{i}.csv")
        assert back.attrs["worker"] == worker and back.attrs["worker_index"] == i
        expected = t.reset_index(drop=True)
        pd.testing.assert_frame_equal(back[expected.columns], expected, check_dtype=False, check_exact=False)
    from dask_influx_metrics.client import peaks

    for per_job in (True, False):
        from_csv = peaks.to_lists(peaks.from_tables(csvfiles.read_tables(tmp_path), "compute-util", per_job), per_job)
        assert from_csv == query.get_peaks(db, "compute-util", per_job=per_job)


def test_a_truncated_answer_is_read_again_in_pages(stores, monitored):
    """A server max-row-limit cuts the grouped answer short: the count check notices, pages fix it."""
    small = query.connect(
        monitored.influxd.url,
        database=monitored.database,
        tags={"run": monitored.run},
        start=pd.Timestamp(stores["spool"].origin_ns, unit="ns", tz="UTC"),
    )
    backend, real_csv, paged = small.backend, small.backend._csv, []
    backend.page_rows = 7

    def limited(q, *args, **kwargs):
        frame = real_csv(q, *args, **kwargs)
        paged.append("LIMIT 7" in q)
        return frame.head(5) if "GROUP BY" in q else frame  # like max-row-limit = 5

    backend._csv = limited
    a = query.worker_tables(small, metrics=METRICS)
    b = query.worker_tables(stores["influxql"], metrics=METRICS)
    assert sum(paged) > 10
    for worker in b:
        pd.testing.assert_frame_equal(a[worker], b[worker])


def test_the_run_wrote_dag_as_the_setting_says(monitored):
    keys = monitored.influxd.query('SHOW TAG KEYS FROM "gpu"', db=monitored.database)
    fields = monitored.influxd.query('SHOW FIELD KEYS FROM "gpu"', db=monitored.database)
    assert ("dag" in {k["tagKey"] for k in keys}) is monitored.dag_tag
    assert ("dag" in {f["fieldKey"] for f in fields}) is not monitored.dag_tag
    assert "dag" not in query.connect(monitored.spool).fields().get("gpu", [])


def test_an_analysis_called_as_a_store_method_says_where_it_is_now(tmp_path):
    from dask_influx_metrics import query

    db = query.Store.__new__(query.Store)  # no backend needed: the attribute lookup fails before any read
    with pytest.raises(AttributeError, match=r"query\.summary\(db, \.\.\.\)"):
        db.summary(per_job=True)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        db.nonsense  # noqa: B018
    from dask_influx_metrics.client.query.store import ANALYSES

    assert all(callable(getattr(query, name)) for name in ANALYSES), "each is on the public path"
