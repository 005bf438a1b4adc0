"""The encoder's fast path (one %-format template per series) writes exactly what the general path
writes: same bytes, same ``stats``; its cache follows changes of tags, field keys and value types."""

from __future__ import annotations

import random

import pytest

from dask_influx_metrics import lineprotocol as lp
from dask_influx_metrics.schema import Point
from test_lineprotocol import BASE_NS, HOSTILE

NAN, INF = float("nan"), float("inf")
VALUES = [0.5, -0.0, 1e308, 5e-324, 123456789.125, NAN, INF, -INF, 7, -3, 2**63 - 1, -2**63, 2**63, -2**63 - 1,
          True, False, None, "", "plain", 'say "hi"', "back\\slash\\", "cr\r only", "crlf\r\n", "form\ffeed",
          "%s %d %%", "{0}", "lone\ud800", "ünïcode"]


def both_paths(monkeypatch, points: list) -> tuple:
    """(fast, general): each point encoded twice (the second from the cache), with ``stats`` after each run."""
    def run():
        lp.stats.clear()
        lines = [(lp.encode(p), lp.encode(p)) for p in points]
        return lines, lp.encode_many(points), dict(lp.stats)

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(lp, "_fast_fields", lambda point: None)
        general = run()
    return fast, general


def test_the_fast_path_is_taken_for_sampler_like_points():
    p = Point("gpu", {"host": "h", "index": "0"}, {"u": 1.5, "mem": 3, "busy": True, "s": 'a"b'}, BASE_NS)
    assert lp._fast_fields(p) == b'gpu,host=h,index=0 u=1.5,mem=3i,busy=true,s="a\\"b" ' + str(BASE_NS).encode()
    assert lp._fast_fields(p._replace(time_ns=None)) == b'gpu,host=h,index=0 u=1.5,mem=3i,busy=true,s="a\\"b"'


@pytest.mark.parametrize("seed", range(4))
def test_mixed_types_write_what_the_general_path_writes(monkeypatch, seed):
    rng = random.Random(seed)
    keys = ["a", "b", "%", "%d", "c d", "x,y", "k=v", "time", "", "v\\", "{x}"] + HOSTILE[:12]
    points = []
    for i in range(400):
        fields = {rng.choice(keys): rng.choice(VALUES) for _ in range(rng.randint(1, 5))}
        tags = {rng.choice(["t", "%t", "u v"]): rng.choice(["1", "%s", "", "a b", "lone\ud800"])}
        time_ns = rng.choice([None, BASE_NS + i, -1, 2**70, 1.5])
        points.append(Point(rng.choice(["m", "%m", "#c", ""]), tags, fields, time_ns))
    fast, general = both_paths(monkeypatch, points)
    assert fast == general


def test_the_cache_follows_tags_keys_and_types(monkeypatch):
    series = Point("m", {"t": "1"}, {"a": 1.5, "b": 2}, BASE_NS)
    changes = [
        series._replace(tags={"t": "2"}), series._replace(tags={"t": "1", "u": "x"}), series._replace(tags={}),
        series._replace(tags={"t": ""}), series._replace(measurement="n"),
        series._replace(fields={"a": 2, "b": 2}), series._replace(fields={"a": "1.5", "b": 2}),
        series._replace(fields={"a": True, "b": 2}), series._replace(fields={"a": None, "b": 2}),
        series._replace(fields={"a": 1.5, "b": 2.0}), series._replace(fields={"b": 2, "a": 1.5}),
        series._replace(fields={"a": 1.5, "c": 2}), series._replace(fields={"a": NAN, "b": 2}),
        series._replace(fields={"a": 1.5, "b": 2**64}), series._replace(time_ns=None),
    ]
    points = [p for change in changes for p in (series, change)]  # back to the first series after each change
    fast, general = both_paths(monkeypatch, points)
    assert fast == general
    first, others = {line for line, _ in fast[0][0::2]}, [line for line, _ in fast[0][1::2]]
    assert first == {b"m,t=1 a=1.5,b=2i %d" % BASE_NS} and first.isdisjoint(others)
    assert others[5:9] == [b"m,t=1 a=2i,b=2i %d" % BASE_NS, b'm,t=1 a="1.5",b=2i %d' % BASE_NS,
                           b"m,t=1 a=true,b=2i %d" % BASE_NS, b"m,t=1 b=2i %d" % BASE_NS]


def test_changing_a_tag_dict_in_place_is_seen():
    tags = {"t": "1"}
    p = Point("m", tags, {"v": 1.0}, 5)
    assert lp.encode(p) == b"m,t=1 v=1.0 5"
    tags["t"] = "2"
    assert lp.encode(p) == b"m,t=2 v=1.0 5"


def test_percent_signs_in_names_are_not_format_directives():
    p = Point("%s%%", {"%d": "%r"}, {"%i": 1.0, "%%": 2, "s": "%s"}, 3)
    assert lp.encode(p) == b'%s%%,%d=%r %i=1.0,%%=2i,s="%s" 3'


def test_unhashable_tag_values_take_the_general_path():
    p = Point("m", {"t": ["a"]}, {"v": 1.0}, 1)
    assert lp.encode(p) == b"m,t=['a'] v=1.0 1"


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(lp, "_CACHE_LIMIT", 10)
    lp._lines.clear()
    for i in range(25):
        assert lp.encode(Point("m", {"i": str(i)}, {"v": 1.0}, 1)) == b"m,i=%d v=1.0 1" % i
        assert len(lp._lines) <= 10
