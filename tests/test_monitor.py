"""End to end: a real LocalCluster, the real influxd, its UDP listener standing in for Telegraf."""

import json
import os
import socket
import threading
import time
import uuid

import pytest
from distributed import Client, LocalCluster, worker_client

from dask_influx_metrics import Monitor, custom_metric, query

POLL_MS = 50


def slow(x, delay=0.3):
    threading.Event().wait(delay)  # a task that takes a while (simulated work)
    return x


def fail(x):
    raise ValueError("this task fails on purpose")


def spawn_children(n):
    with worker_client() as c:
        return sum(c.gather(c.map(slow, range(n), delay=0.05, pure=False)))


@custom_metric("index-times-ten", per_device=True)
def index_times_ten(worker, handle):
    return handle.index * 10


@custom_metric("device-count", per_device=False)
def device_count(worker, handles):
    return len(handles)


@custom_metric("always-broken", per_device=False)
def always_broken(worker, handles):
    raise RuntimeError("custom metric exploded")


@pytest.fixture
def run_id():
    return uuid.uuid4().hex[:10]


@pytest.fixture
def monitor(client, influxd, run_id):
    """A monitor sending over UDP to influxd, tagged with this test's run id."""
    m = Monitor(
        client,
        sink="udp",
        telegraf_address="%s:%d" % influxd.udp_address,
        gpu_source="simulated",
        gpu_count=2,
        tags={"run": run_id},
    )
    yield m
    try:
        m.stop()
    except RuntimeError:
        pass  # the test stopped it already


def rows(influxd, query, run_id, minimum=1):
    return influxd.wait_for(query.replace("$run", run_id), minimum, timeout=15)


def test_every_worker_and_simulated_gpu_reports_with_tags(client, monitor, influxd, run_id):
    monitor.attach(polling_interval=POLL_MS)
    monitor.start()
    client.gather(client.map(slow, range(8), pure=False))
    monitor.stop()
    workers = set(client.scheduler_info()["workers"])
    got = rows(
        influxd, "SELECT count(utilization_gpu) FROM gpu WHERE run='$run' GROUP BY worker, \"index\", host", run_id, 4
    )
    assert {(r["worker"], r["index"]) for r in got} == {(w, i) for w in workers for i in ("0", "1")}
    assert {r["host"] for r in got} == {socket.gethostname()}
    busy = influxd.query(f"SELECT tasks, running, job, dag FROM worker WHERE run='{run_id}' AND tasks > 0")
    assert busy and {(r["job"], r["dag"]) for r in busy} == {("1", "1")}
    for measurement in ("host", "worker", "gpu"):
        assert influxd.query(f"SELECT * FROM {measurement} WHERE run='{run_id}' LIMIT 1")


def test_concurrent_clients_get_distinct_jobs_and_samples_list_only_running_dags(cluster, monitor, influxd, run_id):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    monitor.start()
    with Client(cluster) as a, Client(cluster) as b:
        fa = a.map(slow, range(6), key=[f"a-{i}" for i in range(6)])
        fb = b.map(slow, range(6), key=[f"b-{i}" for i in range(6)])
        a.gather(fa), b.gather(fb)
    monitor.stop()
    dags = monitor.jobs()["dags"]
    assert len(dags) == 2 and {d["job"] for d in dags.values()} == {1, 2}
    dag_of_prefix = {("a" if d["client"] == a.id else "b"): str(n) for n, d in dags.items()}
    samples = rows(influxd, "SELECT running, dag, job FROM worker WHERE run='$run' AND tasks > 0", run_id)
    for s in samples:
        expected = sorted({dag_of_prefix[key[0]] for key in json.loads(s["running"])}, key=int)
        assert s["dag"] == ",".join(expected), s


def test_manual_new_job_is_ordered_exactly_with_submissions(client, monitor):
    monitor.attach(job_type="manual", polling_interval=POLL_MS)
    monitor.start()
    futures = []
    for i in range(3):  # no waiting between new_job() and submit: order must still hold
        monitor.new_job()
        futures.append(client.submit(slow, i, 0.01, key=f"manual-{i}"))
    client.gather(futures)
    monitor.new_job(job=10)
    client.submit(slow, 9, 0.01, key="manual-explicit").result()
    dags = monitor.jobs()["dags"]
    assert [dags[n]["job"] for n in sorted(dags)] == [1, 2, 3, 10]


def test_new_job_needs_manual_mode(monitor):
    monitor.attach()
    with pytest.raises(ValueError, match="manual"):
        monitor.new_job()


def test_failing_graph_still_ends_its_dag(client, monitor, influxd, run_id):
    monitor.attach(polling_interval=POLL_MS)
    monitor.start()
    bad = client.submit(fail, 1, key="fails")
    downstream = client.submit(slow, bad, key="after-fail")
    with pytest.raises(ValueError):
        downstream.result()
    ok = client.submit(slow, 2, 0.01, key="after-ok")
    assert ok.result() == 2
    monitor.stop()
    dags = monitor.jobs()["dags"]
    assert dags[1]["status"] == "erred" and dags[1]["ended"] is not None
    assert dags[2]["status"] == "erred" and dags[3]["status"] == "ok"
    ends = rows(influxd, "SELECT event, status FROM dag WHERE run='$run' AND event='end'", run_id, 3)
    assert sorted(r["status"] for r in ends) == ["erred", "erred", "ok"]


def test_tasks_submitted_from_tasks_belong_to_the_parent_job(cluster, monitor):
    monitor.attach(polling_interval=POLL_MS)
    monitor.start()
    with Client(cluster) as other:
        other.submit(slow, 0, 0.01).result()  # job 1
        with Client(cluster) as parent:
            assert parent.submit(spawn_children, 3, key="parent").result() == 3
    jobs = monitor.jobs()
    assert set(jobs["jobs"]) == {1, 2}
    assert [d["job"] for d in jobs["dags"].values()] == [1, 2, 2]


def test_custom_metrics_land_and_a_broken_one_is_reported_once(client, monitor, influxd, run_id):
    monitor.attach(
        polling_interval=POLL_MS,
        tracking=["compute-util"],
        custom_metrics=[index_times_ten, device_count, always_broken],
    )
    monitor.start()
    got = rows(
        influxd, 'SELECT last("index-times-ten") FROM custom WHERE run=\'$run\' GROUP BY worker, "index"', run_id, 4
    )
    assert sorted({r["last"] for r in got}) == [0.0, 10.0]
    counts = rows(influxd, 'SELECT last("device-count") FROM custom WHERE run=\'$run\' GROUP BY worker', run_id, 2)
    assert {r["last"] for r in counts} == {2.0}
    before = influxd.query(f"SELECT count(utilization_gpu) FROM gpu WHERE run='{run_id}'")[0]["count"]
    influxd.wait_for(
        f"SELECT count(utilization_gpu) FROM gpu WHERE run='{run_id}'",
        lambda r: r and r[0]["count"] > before + 8,
        timeout=15,
    )  # still sampling
    monitor.stop()
    events = [
        e
        for _, e in client.get_events("influx-metrics")
        if e.get("what") == "custom-metric" and e.get("metric") == "always-broken"
    ]
    assert len(events) == 2  # once per worker
    assert all("custom metric exploded" in e["message"] and e["problem"] == "failed" for e in events)
    # issue 24 item 4: readers name it as failed, with the first error, not as "unknown"
    failed = monitor.jobs()["last_session"]["failed_metrics"]
    assert list(failed) == ["always-broken"] and failed["always-broken"]["worker"] in {e["worker"] for e in events}
    with pytest.raises(
        ValueError,
        match=r"custom metric 'always-broken' failed: RuntimeError: custom metric "
        r"exploded \(first report, on tcp://.*\); no samples of it in",
    ):
        monitor.get_peaks("always-broken", source=influxd.url)
    assert any("'always-broken' failed" in n for n in monitor.query(source=influxd.url).notes)
    assert monitor.get_peaks("device-count", source=influxd.url, per_job=False) == [[2.0], [2.0]]


# A trailing backslash cannot be stored by InfluxDB 1.x; lineprotocol's policy
# (trim it) is tested in test_lineprotocol.py against the same influxd.
HOSTILE = 'sp ace,com=ma "quo\\te" ünï\\,= x'


def test_hostile_tag_values_round_trip_through_influxd(client, influxd, run_id):
    m = Monitor(
        client,
        sink="udp",
        telegraf_address="%s:%d" % influxd.udp_address,
        gpu_source="none",
        tags={"run": run_id, "note": HOSTILE},
    )
    m.attach(polling_interval=POLL_MS, tracking=["host-cpu"])
    m.start()
    try:
        got = rows(influxd, "SELECT last(cpu_percent) FROM host WHERE run='$run' GROUP BY note", run_id)
    finally:
        m.stop()
    assert got[0]["note"] == HOSTILE


def test_worker_joining_after_start_is_monitored(cluster, monitor, influxd, run_id):
    monitor.attach(polling_interval=POLL_MS, tracking=["tasks"])
    monitor.start()
    before = set(cluster.scheduler_info["workers"])
    cluster.scale(len(before) + 1)
    try:
        with Client(cluster) as c:
            c.wait_for_workers(len(before) + 1, timeout=30)
            new = set(c.scheduler_info()["workers"]) - before
            got = rows(
                influxd, "SELECT count(tasks) FROM worker WHERE run='$run' GROUP BY worker", run_id, len(before) + 1
            )
            assert new <= {r["worker"] for r in got}
    finally:
        monitor.stop()
        cluster.scale(len(before))


def test_stop_from_a_second_client_stops_sampling_everywhere(cluster, client, influxd):
    first = Monitor(client, gpu_source="simulated", sink="udp", telegraf_address="%s:%d" % influxd.udp_address)
    first.attach(polling_interval=POLL_MS)
    first.start()

    def samplers():  # the monitor's thread in each worker (beside the agent: its link's)
        return client.run(lambda: sum(t.name.startswith("influx-metrics-") for t in threading.enumerate()))

    assert set(samplers().values()) == {1}
    with Client(cluster) as second:
        session = Monitor(second).stop()
    assert session["id"] and set(samplers().values()) == {0}
    with pytest.raises(RuntimeError, match="no monitoring session"):
        Monitor(client).stop()


def test_interleaved_attach_from_two_clients_starts_with_the_starters_settings(cluster, client, tmp_path):
    # issue 23 item 3: A.attach, B.attach, A.start ran A's session with B's tags, spool and interval
    a = Monitor(client, sink="spool", spool_directory=str(tmp_path / "a"), gpu_source="simulated", tags={"run": "a"})
    a.attach(polling_interval=POLL_MS, tracking=["compute-util"], custom_metrics=[device_count])
    with Client(cluster) as other:
        b = Monitor(other, sink="spool", spool_directory=str(tmp_path / "b"), gpu_source="none", tags={"run": "b"})
        b.attach(polling_interval=400, tracking=["host-cpu"])
        session = a.start()
        try:
            client.gather(client.map(slow, range(4), delay=0.2, pure=False))
        finally:
            a.stop()
    assert all(where["spool"].startswith(str(tmp_path / "a")) for where in session["destinations"].values())
    assert not (tmp_path / "b").exists()
    db = a.query()
    assert db.scope().endswith("tags {'run': 'a'}") and len(db.workers()) == 2
    assert {"compute-util", "device-count"} <= set(db.metrics()) and "host-cpu" not in db.metrics()
    steps = query.worker_tables(db, metrics=["compute-util"])[db.workers()[0]]["timestamp"].diff().dropna()
    assert steps.median() < 0.2  # A's 50 ms, not B's 400 ms
    a.shutdown()


def test_readers_take_only_the_sessions_own_series(client, influxd, fresh_db, tmp_path):
    # issue 23 item 5: another tool's worker series was listed as a Dask worker (renumbering every index
    # and CSV file), and a foreign host point crashed host_tables
    m = Monitor(
        client,
        sink="http",
        influxdb_url=influxd.url,
        database=fresh_db,
        gpu_source="simulated",
        gpu_count=1,
        spool_directory=str(tmp_path / "spool"),
    )
    m.attach(polling_interval=POLL_MS, tracking=["compute-util", "host-cpu", "tasks"])
    m.start()
    try:
        client.gather(client.map(slow, range(4), delay=0.2, pure=False))
        now = time.time_ns()
        for line in (
            f"worker,host=elsewhere,worker=celery@host,job=x,dag=y tasks=3i {now}",
            f"gpu,host=elsewhere,worker=celery@host,index=0 utilization_gpu=1000.0 {now}",
            f"host,host={socket.gethostname()},worker=celery@host cpu_percent=1000.0 {now}",
            f"host,host=elsewhere cpu_percent=1000.0 {now}",
        ):  # no tags at all
            influxd.write(line, db=fresh_db)
        influxd.wait_for(
            'SELECT count(cpu_percent) FROM host WHERE cpu_percent > 999',
            lambda r: r and r[0]["count"] == 2,
            timeout=10,
            db=fresh_db,
        )
        threading.Event().wait(0.2)
    finally:
        m.stop()
    ours = sorted(client.scheduler_info()["workers"])
    db = m.query()
    assert sorted(db.workers()) == ours and len(query.worker_tables(db)) == 2
    assert list(query.host_tables(db)) == [socket.gethostname()]
    assert (query.host_tables(db)[socket.gethostname()]["host-cpu"] < 999).all()
    assert set(query.summary(db)["worker"]) == {*ours, "all workers"}  # and each GPU once, over them
    paths = m.to_csv(tmp_path / "csv")
    assert [os.path.basename(p) for p in paths] == ["worker_0.csv", "worker_1.csv", "workers.csv"]
    assert all(max(p) < 999 for p in query.get_peaks(db, "host-cpu", per_job=False))
    assert all(max(p) < 999 for p in query.get_peaks(db, "compute-util", per_job=False))
    assert not any("celery@host" in n for n in db.notes)  # not in the session: never read
    # without the session's record: the latest session with an id (the foreign points have none)
    with query.connect(influxd.url, fresh_db) as plain:
        assert sorted(plain.workers()) == ours
        assert any("the latest of 2" in n and "'unnamed'" in n for n in plain.notes)
    # every session: only Dask addresses are workers
    with query.connect(influxd.url, fresh_db, session="all") as plain:
        assert sorted(plain.workers()) == ours
        assert any("'celery@host'" in n and "not a Dask worker address" in n for n in plain.notes)
        assert (query.host_tables(plain)[socket.gethostname()]["host-cpu"] < 999).all()
    m.shutdown()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"tracking": ["compute-util", "gpu-fun"]}, ValueError, "gpu-fun"),
        ({"polling_interval": 0}, ValueError, "polling-interval"),
        ({"polling_interval": -1}, ValueError, "polling-interval"),
        ({"telegraf_address": "not-an-address"}, ValueError, "telegraf.address"),
        ({"sink": "udp", "telegraf_address": "x" * 64 + ".invalid:8094"}, ValueError, "does not resolve"),
        ({"custom_metrics": [slow]}, TypeError, "not decorated"),
        ({"job_type": "sometimes"}, ValueError, "job-type"),
        ({"tags": {"run": "x" * 70_000}}, ValueError, "tag 'run'.*70000 bytes"),
    ],
)
def test_bad_input_is_refused_at_attach(client, kwargs, error, message):
    with pytest.raises(error, match=message):
        Monitor(client).attach(**kwargs)


def test_start_without_attach_is_a_clear_error(cluster):
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as lonely, Client(lonely) as c:
        with pytest.raises(RuntimeError, match="attach"):
            Monitor(c).start()


# --- issue 24, item 6
def test_one_tracking_name_as_a_string_is_that_name(client):
    with pytest.raises(ValueError, match=r"gpu-fun") as e:
        Monitor(client).attach(tracking="gpu-fun")
    assert "'g'" not in str(e.value)  # not split into letters
    assert Monitor(client).attach(tracking="mem-util").tracking == ("mem-util",)


def test_stop_twice_is_one_clear_error_and_no_traceback_on_the_scheduler(client):
    monitor = Monitor(client, gpu_source="simulated", sink="spool")
    monitor.attach(polling_interval=POLL_MS)
    session = monitor.start()
    monitor.stop()
    before = len(client.get_scheduler_logs(n=10_000))
    with pytest.raises(
        RuntimeError, match=f"no monitoring session is running on .*the last one, {session['id']}, has already stopped"
    ):
        monitor.stop()
    after = client.get_scheduler_logs(n=10_000)
    assert not [
        m
        for _, m in after[: len(after) - before]  # newest first
        if "Run Failed" in m or "Traceback" in m
    ], "stop() twice logged an error on the scheduler"
    monitor.shutdown()


def test_start_without_attach_uses_attach_settings_not_an_earlier_start_list(client, caplog):
    first = Monitor(client, gpu_source="simulated", sink="spool")
    first.attach(tracking=["compute-util", "tasks"], polling_interval=POLL_MS)
    first.start(tracking=["mem-util"])  # this session only
    first.stop()
    with caplog.at_level("WARNING", logger="dask_influx_metrics"):
        Monitor(client).start()
    assert "start() without attach() on this Monitor reuses the settings attached" in caplog.text
    assert "tracking=['compute-util', 'tasks']" in caplog.text
    tracked = client.run(_worker_tracking)
    assert set(tracked.values()) == {("compute-util", "tasks")}, tracked  # not the earlier start()'s mem-util
    first.shutdown()


def _worker_tracking(dask_worker):
    from dask_influx_metrics import _dask

    return _dask.worker_plugin(dask_worker, "influx-metrics").settings.tracking
