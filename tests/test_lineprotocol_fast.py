"""The encoder's fast path (one %-format template per series) writes exactly what the general path
writes: same bytes, same ``stats``; its cache follows changes of tags, field keys and value types."""

from __future__ import annotations

import math
import random
import struct

import pytest
from test_lineprotocol import BASE_NS, HOSTILE

from dask_influx_metrics import lineparse
from dask_influx_metrics import lineprotocol as lp
from dask_influx_metrics.schema import Point

NAN, INF = float("nan"), float("inf")
VALUES = [
    0.5,
    -0.0,
    1e308,
    5e-324,
    123456789.125,
    NAN,
    INF,
    -INF,
    7,
    -3,
    2**63 - 1,
    -(2**63),
    2**63,
    -(2**63) - 1,
    True,
    False,
    None,
    "",
    "plain",
    'say "hi"',
    "back\\slash\\",
    "cr\r only",
    "crlf\r\n",
    "form\ffeed",
    "%s %d %%",
    "{0}",
    "lone\ud800",
    "ünïcode",
]


def general_only(m) -> None:
    """Within ``monkeypatch.context() as m``: no series gets a template, every point takes the general path."""
    m.setattr(lp, "_lines", {})
    m.setattr(lp, "_line_template", lambda point: None)


def both_paths(monkeypatch, points: list) -> tuple:
    """(fast, general): each point encoded twice (the second from the cache), with ``stats`` after each run."""

    def run():
        lp.stats.clear()
        lines = [(lp.encode(p), lp.encode(p)) for p in points]
        return lines, lp.encode_many(points), dict(lp.stats)

    fast = run()
    with monkeypatch.context() as m:
        general_only(m)
        general = run()
    return fast, general


def test_the_fast_path_is_taken_for_sampler_like_points(monkeypatch):
    general = []
    monkeypatch.setattr(lp, "_general", lambda point: general.append(point))
    p = Point("gpu", {"host": "h", "index": "0"}, {"u": 1.5, "mem": 3, "busy": True, "s": 'a"b'}, BASE_NS)
    assert lp.encode(p) == b'gpu,host=h,index=0 u=1.5,mem=3i,busy=true,s="a\\"b" ' + str(BASE_NS).encode()
    assert lp.encode_many([p._replace(time_ns=None), p]) == [
        b'gpu,host=h,index=0 u=1.5,mem=3i,busy=true,s="a\\"b"',
        lp.encode(p),
    ]
    assert general == []


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
        series._replace(tags={"t": "2"}),
        series._replace(tags={"t": "1", "u": "x"}),
        series._replace(tags={}),
        series._replace(tags={"t": ""}),
        series._replace(measurement="n"),
        series._replace(fields={"a": 2, "b": 2}),
        series._replace(fields={"a": "1.5", "b": 2}),
        series._replace(fields={"a": True, "b": 2}),
        series._replace(fields={"a": None, "b": 2}),
        series._replace(fields={"a": 1.5, "b": 2.0}),
        series._replace(fields={"b": 2, "a": 1.5}),
        series._replace(fields={"a": 1.5, "c": 2}),
        series._replace(fields={"a": NAN, "b": 2}),
        series._replace(fields={"a": 1.5, "b": 2**64}),
        series._replace(time_ns=None),
    ]
    points = [p for change in changes for p in (series, change)]  # back to the first series after each change
    fast, general = both_paths(monkeypatch, points)
    assert fast == general
    first, others = {line for line, _ in fast[0][0::2]}, [line for line, _ in fast[0][1::2]]
    assert first == {b"m,t=1 a=1.5,b=2i %d" % BASE_NS} and first.isdisjoint(others)
    assert others[5:9] == [
        b"m,t=1 a=2i,b=2i %d" % BASE_NS,
        b'm,t=1 a="1.5",b=2i %d' % BASE_NS,
        b"m,t=1 a=true,b=2i %d" % BASE_NS,
        b"m,t=1 b=2i %d" % BASE_NS,
    ]


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
        assert max(map(len, (lp._lines, lp._prefixes, lp._tags, lp._fields, lp._field_keys))) <= 10


def test_a_new_dag_escapes_only_its_own_tags(monkeypatch):
    """When a DAG starts, each series of the sample gets a new prefix: the other tags and the fields are
    found escaped (the agent writes ~20 series a sample, every one of them new at each DAG)."""
    for cache in ("_lines", "_prefixes", "_tags", "_fields"):
        monkeypatch.setattr(lp, cache, {})
    gpu = Point("gpu", {"host": "h", "uuid": "GPU-1", "job": "1", "dag": "1"}, {"u": 1.5, "mem": 3}, 1)
    lines = lp.encode_many([gpu, gpu._replace(tags={**gpu.tags, "dag": "2"})])
    assert lines == [
        b"gpu,dag=1,host=h,job=1,uuid=GPU-1 u=1.5,mem=3i 1",
        b"gpu,dag=2,host=h,job=1,uuid=GPU-1 u=1.5,mem=3i 1",
    ]
    assert len(lp._lines) == 2 and len(lp._fields) == 1 and len(lp._tags) == 5


def random_float(rng: random.Random) -> float:
    """Any finite double: random bits, or a value near a decade or an int (where texts differ most)."""
    while True:
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(x):
            return rng.choice(
                [
                    x,
                    float(f"{rng.random():.3f}e{rng.randint(-30, 30)}"),
                    float(rng.randint(-(10**6), 10**6)),
                    rng.randint(0, 10**4) / 100,
                ]
            )


def sample(rng: random.Random, t: int) -> list:
    """A sampler-like batch: several series of numbers-only points (floats, ints, bools), time or not."""
    return [
        Point(
            "gpu",
            {"index": str(i), "job": "%d" % (t % 3)},
            {
                "util": random_float(rng),
                "mem": rng.randint(-(2**53) + 1, 2**53 - 1),
                "on": rng.random() < 0.5,
                "%s": random_float(rng),
            },
            None if i == 3 else t + i,
        )
        for i in range(5)
    ] + [Point("host", {"host": "h"}, {"cpu": random_float(rng), "load": random_float(rng)}, t)]


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_of_numbers_writes_what_each_point_writes_alone(monkeypatch, seed):
    rng = random.Random(seed)
    for t in range(200):
        points = sample(rng, t)
        lines = lp.encode_many(points)
        assert lines == [lp.encode(p) for p in points]
        with monkeypatch.context() as m:
            general_only(m)
            assert lines == [lp.encode(p) for p in points]  # the general path: the same bytes
        assert [lineparse.parse(line) for line in lines] == [p._replace(fields=dict(p.fields)) for p in points]


@pytest.mark.parametrize("bad", [NAN, INF, -INF, 2**63, -(2**63) - 1])
def test_one_unwritable_value_in_a_batch_leaves_the_others_as_they_were(bad):
    points = sample(random.Random(9), 7)
    lp.stats.clear()
    good = lp.encode_many(points)
    broken = points[:2] + [points[2]._replace(fields={**points[2].fields, "util": bad})] + points[3:]
    lines = lp.encode_many(broken)
    assert lines[:2] + lines[3:] == good[:2] + good[3:]
    assert lineparse.parse(lines[2]).fields == {k: v for k, v in points[2].fields.items() if k != "util"}
    assert sum(lp.stats.values()) == 1


@pytest.mark.parametrize("big", [2**53, -(2**53), 2**63 - 1, -(2**63)])
def test_ints_beyond_2_53_are_written_exactly(big):
    """orjson is asked to refuse them (beyond float precision), so such a batch is written point by point."""
    points = sample(random.Random(3), 5)
    points[1] = points[1]._replace(fields={**points[1].fields, "mem": big})
    lines = lp.encode_many(points)
    assert lines == [lp.encode(p) for p in points] and lineparse.parse(lines[1]).fields["mem"] == big


def test_float_texts_read_back_exactly():
    """The numbers of a batch are written by orjson: the shortest round-trip text, as repr's, spelled its own way."""
    rng = random.Random(1)
    values = [random_float(rng) for _ in range(20_000)] + [5e-324, -0.0, 1e-5, 1e-7, 1e16, 1e22, 2.0**63]
    point = Point("m", {}, {f"v{i}": v for i, v in enumerate(values)}, 1)
    [line] = lp.encode_many([point])
    assert lineparse.parse(line).fields == point.fields
    assert line.count(b"e-7") and line.count(b"0.00001,")  # where orjson's spelling differs from repr's


def test_float_texts_are_stored_exactly_by_real_influxd(influxd, fresh_db):
    rng = random.Random(2)
    values = [random_float(rng) for _ in range(1_990)] + [
        5e-324,
        -0.0,
        1e-5,
        1e-7,
        1e16,
        1e22,
        2.0**63,
        1e-300,
        1.7976931348623157e308,
        0.1,
    ]
    points = [
        Point("f", {"i": str(i)}, {f"v{j}": values[i * 10 + j] for j in range(10)}, BASE_NS + i)
        for i in range(len(values) // 10)
    ]
    influxd.write(lp.encode_many(points), db=fresh_db)
    rows = sorted(influxd.query("SELECT * FROM f", db=fresh_db), key=lambda r: r["time"])
    # (the server's JSON writes integral floats as integers: float() reads them back)
    assert [[float(r[f"v{j}"]) for j in range(10)] for r in rows] == [list(p.fields.values()) for p in points]


def each_alone_as_the_general_path(monkeypatch, points: list) -> None:
    """Each point encoded alone, twice (the second from the cached template), gives the general path's bytes and stats."""
    for p in points:
        lp.stats.clear()
        fast = (lp.encode(p), lp.encode(p), dict(lp.stats))
        with monkeypatch.context() as m:
            general_only(m)
            lp.stats.clear()
            general = (lp.encode(p), lp.encode(p), dict(lp.stats))
        assert fast == general, p


def test_fast_numeric_path_writes_what_the_general_path_writes(monkeypatch):
    nan, inf = float("nan"), float("inf")
    keys = ["a", "b", "{x}", "c d", "time", "", "v\\", "v", "q\"", "lone\ud800"] + HOSTILE[:20]
    values = [0.5, -3, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, nan, inf, -inf, 1e308, True, None, 7, 1.0]
    points = [
        Point("m", {"t": "1"}, {k: v for k, v in zip(keys[i % 5 :], values[j:] + values[:j])}, i)
        for i in range(10)
        for j in range(len(values))
    ]
    points += [
        Point("m", {}, {"a": 1e308, "b": 1e308}, 1),
        Point("m", {}, {"a": 1.5, "b": 2}, None),
        Point("m", {}, {"a": 10**400, "b": 1.0}, 1),
        Point("m", {}, {"a": 1.0, "b": 10**400}, 1),
    ]
    each_alone_as_the_general_path(monkeypatch, points)


def test_fast_path_with_string_fields_writes_what_the_general_path_writes(monkeypatch):
    texts = [
        "",
        "plain",
        'say "hi"',
        "back\\slash\\",
        "cr\r only",
        "crlf\r\n",
        "form\ffeed",
        "{0} {x}",
        "lone\ud800",
        "ünïcode",
    ] + HOSTILE[:10]
    others = [1.5, 7, float("nan"), 2**63, None, True]
    points = [Point("m", {"t": "1"}, {"s": text, "n": other}, i) for i, text in enumerate(texts) for other in others]
    points += [Point("m", {}, {"s": text}, 1) for text in texts] + [Point("m", {}, {"a": "x", "b": "y"}, None)]
    each_alone_as_the_general_path(monkeypatch, points)


def test_a_batch_written_again_point_by_point_counts_each_drop_once(monkeypatch):
    """The caches are cleared between batches, never inside one: the fallback finds what the batch built."""
    monkeypatch.setattr(lp, "_CACHE_LIMIT", 2)
    points = [Point("m", {"": "v", "time": "x"}, {"x": NAN, "y": 1.0}, 1)] + [
        Point("m", {"i": str(i)}, {"y": 1.0}, 1) for i in range(5)
    ]
    lp.stats.clear()
    lines = lp.encode_many(points)
    stats = dict(lp.stats)
    with monkeypatch.context() as m:
        general_only(m)
        lp.stats.clear()
        assert lp.encode_many(points) == lines
        assert dict(lp.stats) == stats == {"empty_key": 1, "reserved_key": 1, "nonfinite": 1}
    assert lp.encode_many(points[:1]) and len(lp._lines) == 1  # full: cleared before the next batch
