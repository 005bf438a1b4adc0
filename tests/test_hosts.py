"""Host metrics read by host (client/hosts.py): one host series per host, joined into every worker's
table by time; host peaks and summaries are the host's, from the series' union tags; older data in
which every worker wrote its own host series still reads right. InfluxQL, Flux and the spool agree."""

import pandas as pd
import pytest

from dask_influx_metrics import lineprotocol, query
from dask_influx_metrics.schema import Point

W1, W2, W3 = "tcp://10.0.0.1:1", "tcp://10.0.0.1:2", "tcp://10.0.0.2:1"
HOSTS = {W1: "node-a", W2: "node-a", W3: "node-b"}
T0 = 1_800_000_000_000_000_000
STEP = 200_000_000  # the polling interval
OFFSET = {W1: 0, W2: 90_000_000, W3: 50_000_000}  # each worker samples on its own clock
N = 10
# (job, dag) of each worker per sample: W1 runs job 1, then job 1 beside W2's job 2, then leaves
# (exits after sample 6); W2 runs job 2 from sample 3; W3 (another host) runs job 1 throughout
STATES = {W1: [("1", "1")] * 7, W2: [("0", "0")] * 3 + [("2", "2")] * 7, W3: [("1", "1")] * N}


def union(k: int) -> tuple[str, str]:
    busy = [STATES[w][k] for w in (W1, W2) if k < len(STATES[w]) and STATES[w][k][1] != "0"]
    return (",".join(sorted({j for j, _ in busy})) or "1", ",".join(sorted({d for _, d in busy})) or "0")


def cpu(host: str, k: int) -> float:
    return 10.0 * k + (0.5 if host == "node-b" else 0.0)


def samples(out: list):
    """Each worker's samples in turn: its ``worker`` point goes into ``out``; yields (worker, k, tags, time)."""
    for w in (W1, W2, W3):
        for k, (job, dag) in enumerate(STATES[w]):
            t = T0 + k * STEP + OFFSET[w]
            common = {"host": HOSTS[w], "worker": w, "job": job, "dag": dag}
            out.append(Point("worker", common, {"tasks": int(dag != "0"), "rss": 1000 + k}, t))
            yield w, k, common, t


def host_once_points() -> list[Point]:
    """What this version writes: node-a's host series by W1 (its lock holder) until it exits after
    sample 6, then by W2 (takeover, on W2's clock), tagged with the union of both workers' jobs."""
    out = []
    for w, k, common, t in samples(out):
        if w == W3:
            out.append(Point("host", common, {"cpu_percent": cpu("node-b", k)}, t))
        elif w == W1 or k > 6:
            job_u, dag_u = union(k)
            out.append(Point("host", {**common, "job": job_u, "dag": dag_u}, {"cpu_percent": cpu("node-a", k)}, t))
    return out


def legacy_points() -> list[Point]:
    """What older versions wrote (and ``host-once: false``): every worker its own host series, with its own
    tags, at its own sample times (W2's readings 1 % above W1's, to tell them apart)."""
    out = []
    for w, k, common, t in samples(out):
        out.append(Point("host", common, {"cpu_percent": cpu(HOSTS[w], k) + (1.0 if w == W2 else 0.0)}, t))
    return out


DATA = {"host-once": host_once_points, "legacy": legacy_points}


@pytest.fixture(scope="module")
def stores(influxd, tmp_path_factory):
    pytest.importorskip("influxdb_client")
    from fake_influx2 import FakeInflux
    from flux_points import answer_from

    out, fakes = {}, []
    for name, make in DATA.items():
        points = make()
        db = influxd.create_database(f"hosts_{name.replace('-', '_')}")
        influxd.write(b"\n".join(lineprotocol.encode_many(points)), db=db)
        root = tmp_path_factory.mktemp(f"hosts-{name}")
        for w in (W1, W2, W3):
            folder = root / "20270101T000000-000001" / w.replace(":", "_").replace("/", "_")
            folder.mkdir(parents=True)
            mine = [p for p in points if p.tags["worker"] == w]
            (folder / "spool-1-000000.lp").write_bytes(b"\n".join(lineprotocol.encode_many(mine)) + b"\n")
        fake = FakeInflux()
        fake.answer = answer_from(points)
        fakes.append(fake)
        out[name] = {
            "influxql": query.connect(influxd.url, db),
            "spool": query.connect(root),
            "flux": query.connect(fake.url, "dask_metrics", language="flux", timeout=5),
        }
    yield out
    for kinds in out.values():
        for db in kinds.values():
            db.close()
    for fake in fakes:
        fake.stop()


KINDS = ["influxql", "flux", "spool"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("data", sorted(DATA))
def test_every_worker_table_has_its_hosts_columns(stores, data, kind):
    db = stores[data][kind]
    assert db.hosts() == HOSTS
    tables = query.worker_tables(db, metrics=["host-cpu", "tasks"])
    for w, table in tables.items():
        own = len(STATES[w])
        assert len(table) == own, "a worker's rows are its own samples; host points add none"
        expected = [cpu(HOSTS[w], k) for k in range(own)]
        if data == "legacy" and w == W2:
            expected = [v + 1.0 for v in expected]  # its own readings, as before
        assert list(table["host-cpu"]) == expected, w
        assert list(table["job"]) == [j for j, _ in STATES[w]], "each row keeps the worker's own job"
    other = query.worker_tables(stores[data]["spool"], metrics=["host-cpu", "tasks"])
    for w in tables:
        pd.testing.assert_frame_equal(tables[w], other[w], check_dtype=False)


@pytest.mark.parametrize("kind", KINDS)
def test_one_host_series_written_once_per_host(stores, kind):
    db = stores["host-once"][kind]
    rows = db.backend.max_by("host", "cpu_percent", ("host", "worker"))
    assert sorted(zip(rows["host"], rows["worker"])) == [("node-a", W1), ("node-a", W2), ("node-b", W3)], (
        "node-a: W1, then W2 after it left (one writer at a time)"
    )
    series = db.host_series("node-a", ["cpu_percent"])
    assert series["time"].is_unique and len(series) == N


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("server", [True, False])
def test_host_peaks_are_the_hosts_per_job(stores, kind, server):
    """A job's host peak: the host's largest reading while the job ran on any worker of the host."""
    db = stores["host-once"][kind]
    node_a = {1: [60], 2: [90]}  # job 1 ran up to sample 6 (on W1), job 2 from sample 3 (on W2)
    assert query.get_peaks(db, "host-cpu", server=server) == [node_a, node_a, {1: [90.5]}]
    assert query.get_peaks(db, "host-cpu", per_job=False, server=server) == [[90], [90], [90.5]]
    assert query.get_peaks(db, "host-cpu", workers=[1], server=server) == [node_a]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("data", sorted(DATA))
@pytest.mark.parametrize("per_job", [True, False])
def test_server_side_equals_client_side(stores, data, kind, per_job):
    db = stores[data][kind]
    server, client = (
        query.peaks(db, "host-cpu", per_job=per_job, server=True),
        query.peaks(db, "host-cpu", per_job=per_job, server=False),
    )
    assert len(server) and set(server["worker"]) == {W1, W2, W3}
    pd.testing.assert_frame_equal(server, client, check_dtype=False)
    pd.testing.assert_frame_equal(
        query.peaks(db, "host-cpu", job=2, per_job=per_job, server=True),
        query.peaks(db, "host-cpu", job=2, per_job=per_job, server=False),
        check_dtype=False,
    )


def test_legacy_peaks_follow_the_same_rule(stores):
    """Older data: every reading of the host taken while job J ran on one of its workers counts for J."""
    db = stores["legacy"]["influxql"]
    assert query.get_peaks(db, "host-cpu") == [{1: [60], 2: [91]}] * 2 + [{1: [90.5]}]  # job 2: W2's own readings


@pytest.mark.parametrize("data", sorted(DATA))
def test_summary_cpu_rows_are_the_hosts(stores, data):
    s = query.summary(stores[data]["spool"])
    cpu_rows = s[s["resource"] == "cpu"].set_index(["worker", "job"])
    whole = cpu_rows[cpu_rows.index.get_level_values("job").isna()]
    a1, a2 = (whole.loc[w].iloc[0] for w in (W1, W2))
    assert a1["max"] == a2["max"] and a1["mean"] == a2["mean"], "every worker of a host: the host's figures"
    # time-weighted (issue 23 item 6): the host's wall time, counted once, from its first reading to
    # its last plus the last one's interval (a writer's step; older data: half of it, two writers)
    last = N - 1
    if data == "host-once":  # W2 took over on its own clock, 90 ms later
        assert a1["hours"] == pytest.approx((last * STEP + OFFSET[W2] + STEP) / 1e9 / 3600)
    else:  # two writers at once, W1 left early: no longer an undercount
        assert a1["hours"] == pytest.approx((last * STEP + OFFSET[W2] + STEP / 2) / 1e9 / 3600)
    jobs = cpu_rows[cpu_rows.index.get_level_values("job").notna()]
    node_a = jobs.loc[W1]
    assert sorted(node_a.index) == [1, 2] and node_a.loc[1, "max"] == 60
    if data == "host-once":
        assert node_a.loc[2, "samples"] == 7 and node_a.loc[1, "samples"] == 7
    for t in stores[data]["influxql"], stores[data]["flux"]:
        pd.testing.assert_frame_equal(query.summary(t), s, check_dtype=False)


def test_csv_export_keeps_the_host_columns(stores, tmp_path):
    from dask_influx_metrics.client.csvfiles import read_worker_csv

    db = stores["host-once"]["influxql"]
    paths = query.to_csv(db, tmp_path, metrics=["host-cpu"])
    assert len(paths) == 4  # three workers and workers.csv
    table = read_worker_csv(paths[1])
    assert list(table["host-cpu"]) == [cpu("node-a", k) for k in range(N)]
