"""InfluxDB 3: the contract has no tag/field name collision; the HTTP sink writes and the InfluxQL
reader reads through a fake 3.x endpoint (tests/fake_influx3.py) that enforces the 3.x rules."""

from __future__ import annotations

import base64

import pandas as pd
import pytest
import requests
from conftest import _slow
from fake_influx2 import points
from fake_influx3 import FakeInflux3
from listsink import ListSink

from dask_influx_metrics import custom_metric, lineprotocol, query, schema
from dask_influx_metrics.sinks.http import HttpOptions, HttpSink


@pytest.fixture
def fake3(influxd):
    fake = FakeInflux3(influxd)
    yield fake
    fake.stop()


def write(url, lines, fallback=None, **options):
    sink = HttpSink(url, "dask_metrics", HttpOptions(flush_interval=0.01, **options), fallback=fallback)
    sink.send(lines)
    sink.close()
    return sink


# --- the data contract ------------------------------------------------------------------------
def test_no_tag_shares_a_name_with_a_field_of_its_measurement():
    assert schema.tag_field_collisions() == []
    assert {m for m, _ in schema.FIELDS} | {schema.CUSTOM} == set(schema.MEASUREMENT_TAGS)
    # what the extra tags setting and custom metric names could still collide with
    assert schema.tag_field_collisions(extra_tags=["tasks", "run"]) == ["dag.tasks", "worker.tasks"]
    assert schema.tag_field_collisions(custom_fields=["index", "power"]) == ["custom.index"]


@pytest.mark.parametrize("name", sorted(schema.MEASUREMENT_TAGS[schema.CUSTOM]))
def test_a_custom_metric_named_like_a_tag_is_refused(name):
    with pytest.raises(ValueError, match=f"'{name}' is a tag name"):
        custom_metric(name)


# --- the fake enforces the documented 3.x rules ----------------------------------------------------
def test_fake_wants_a_token_in_any_documented_form(fake3):
    def post(path, **kw):
        return requests.post(fake3.url + path, data=b"m,t=a v=1 1", timeout=5, **kw)

    assert post("/write", params={"db": "d"}).status_code == 401
    assert post("/write", params={"db": "d"}, headers={"Authorization": "Token wrong"}).status_code == 401
    basic = base64.b64encode(f"ignored:{fake3.token}".encode()).decode()
    for headers, params in [
        ({"Authorization": f"Token {fake3.token}"}, {"db": "d"}),
        ({"Authorization": f"Bearer {fake3.token}"}, {"db": "d"}),
        ({"Authorization": f"Basic {basic}"}, {"db": "d"}),
        ({}, {"db": "d", "p": fake3.token}),
    ]:
        assert post("/write", params=params, headers=headers).status_code == 204
    bearer = {"Authorization": f"Bearer {fake3.token}"}
    assert post("/api/v3/write_lp", params={"db": "d", "precision": "nanosecond"}, headers=bearer).status_code == 204
    assert post("/api/v2/write", params={"bucket": "d", "org": "x"}, headers=bearer).status_code == 204
    assert post("/write", params={"db": "d", "precision": "nanosecond"}, headers=bearer).status_code == 400
    assert post("/api/v2/query", headers=bearer).status_code == 404  # no Flux on 3.x


def test_fake_refuses_tag_field_collisions_and_kind_changes_partially(fake3):
    body = "\n".join(["m,t=a v=1 1", "m,v=x w=1 2", "m t=1 3", "m,t=b v=2i 4", "m,t=c v=3 5", "n,v=x v=1 6"])
    r = requests.post(
        fake3.url + "/write",
        params={"db": "d"},
        data=body,
        timeout=5,
        headers={"Authorization": f"Token {fake3.token}"},
    )
    assert r.status_code == 400
    assert [e["line_number"] for e in r.json()["data"]] == [2, 3, 4, 6]
    rows = requests.get(
        fake3.influxd.url + "/query", params={"db": fake3.real("d"), "q": 'SELECT v FROM "m"'}, timeout=5
    ).json()["results"][0]["series"][0]["values"]
    assert [v for _, v in rows] == [1, 3]  # the good lines were written


# --- the HTTP sink against 3.x ------------------------------------------------------------------
def test_http_sink_writes_the_contract_to_3x_with_a_token(fake3):
    lines = lineprotocol.encode_many(points())
    sink = write(fake3.url, lines, token=fake3.token, fallback=ListSink())
    assert (sink.points_written, sink.points_failed) == (len(lines), 0)
    assert fake3.requests[-1]["path"] == "/write"
    assert fake3.requests[-1]["params"]["precision"] == "ns"
    assert fake3.databases == {"dask_metrics"}

    refused = ListSink()
    sink = write(fake3.url, lines, fallback=refused)  # no token: 401, everything kept
    assert sink.points_written == 0 and refused.lines == lines


def test_http_sink_keeps_what_3x_refuses(fake3):
    fallback = ListSink()
    sink = write(fake3.url, [b"worker,tasks=1 tasks=2i 1"], token=fake3.token, fallback=fallback)
    assert (sink.points_refused, sink.points_failed) == (1, 0) and fallback.lines == [b"worker,tasks=1 tasks=2i 1"]


def test_a_retention_policy_is_a_database_of_its_own_on_3x(fake3):
    write(fake3.url, lineprotocol.encode_many(points()[:1]), token=fake3.token, retention_policy="week")
    assert fake3.databases == {"dask_metrics/week"}


# --- the InfluxQL reader against 3.x --------------------------------------------------------------
def test_influxql_reader_reads_3x_as_it_reads_1x(fake3, influxd):
    write(fake3.url, lineprotocol.encode_many(points()), token=fake3.token)
    v3 = query.connect(fake3.url, "dask_metrics", token=fake3.token)
    v1 = query.connect(influxd.url, fake3.real("dask_metrics"))
    assert v3.workers() == v1.workers() and v3.jobs() == v1.jobs() == [1, 2]
    pd.testing.assert_frame_equal(v3.dags(), v1.dags())
    pd.testing.assert_frame_equal(query.peaks(v3, "compute-util"), query.peaks(v1, "compute-util"))
    t3, t1 = query.worker_tables(v3), query.worker_tables(v1)
    for worker in t1:
        pd.testing.assert_frame_equal(t3[worker], t1[worker])
    assert list(t3.values())[0]["job"].tolist() == ["0", "1", "1,2"]  # 3.x leaves the comma unescaped
    assert any(r["path"] == "/query" and r["headers"].get("Accept") == "application/csv" for r in fake3.requests)
    with pytest.raises(query.QueryError, match="not found"):
        query.connect(fake3.url, "nope", token=fake3.token)


def test_a_monitored_run_over_http_into_3x_reads_back(fake3, client):
    from dask_influx_metrics import Monitor

    monitor = Monitor(
        client,
        sink="http",
        influxdb_url=fake3.url,
        database="dask_metrics",
        token=fake3.token,
        gpu_source="simulated",
        gpu_count=1,
    )
    monitor.attach(polling_interval=50)
    monitor.start()
    client.gather(client.map(_slow, range(4), delay=0.2))
    monitor.stop()
    db = query.connect(fake3.url, "dask_metrics", token=fake3.token)
    assert db.jobs() == [1]
    tables = query.worker_tables(db, job=1, metrics=["compute-util", "tasks"])
    assert sorted(tables) == sorted(client.scheduler_info()["workers"])
    assert not [r for r in fake3.requests if r["path"] == "/write" and "p" in r["params"]]
