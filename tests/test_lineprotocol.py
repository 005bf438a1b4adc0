"""Line protocol: unit tests, a property test over hostile strings, and a round trip
through the real influxd (the server is the oracle for what survives)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dask_influx_metrics import lineparse
from dask_influx_metrics import lineprotocol as lp
from dask_influx_metrics.schema import Point

BASE_NS = 1_700_000_000_000_000_000

HOSTILE = [
    "plain",
    "with space",
    " leading",
    "trailing ",
    "a,b",
    "a=b",
    'a"b',
    "=",
    ",",
    " ",
    '"',
    "a\\b",
    "a\\\\b",
    "trail\\",
    "trail\\\\",
    "\\",
    "\\ x",
    "a\\,b",
    "a\\=b",
    "a\\ b",
    'a\\"b',
    "a\\\\,b",
    "a\\\\ b",
    "a\\\nb",
    "a\nb",
    "\n",
    "a\r\nb",
    "a\rb",
    "a\tb",
    "a\x00b",
    "a\x7fb",
    "a\fb",
    "#hash",
    "# hash",
    "\\#x",
    "é ünï",
    "日本語",
    "emoji 😀",
    "",
    "time",
    "Time",
    "_field",
    "lone\ud800",
    "x=1 y=2,z",
    'q="x"',
    "\\\\",
    "a\\",
    "\x1b[31mred",
]
KINDS = ("measurement", "tag_key", "tag_value", "field_key", "string")


def expected(kind: str, s: str) -> str:
    """The documented policy, restated independently of the module."""
    if kind == "string":
        s = re.sub(r"\r(?!\n)|\f", " ", s)
    else:
        s = re.sub(r"[\x00-\x1f\x7f]", " ", s)
        s = re.sub(r"\\+\Z", "", s)
        if kind in ("measurement", "field_key"):
            s = re.sub(r'\\+(?=[,= "])', "", s)
        if kind == "measurement" and s.startswith("#"):
            s = "\\" + s
    return s.encode("utf-8", "replace").decode("utf-8")


def point_for(kind: str, s: str, i: int = 0) -> Point:
    t = BASE_NS + i
    return {
        "measurement": Point(s, {"t": "x"}, {"v": 1}, t),
        "tag_key": Point("tk", {s: "x"}, {"v": i}, t),
        "tag_value": Point("tv", {"t": s}, {"v": i}, t),
        "field_key": Point("fk", {}, {s: i}, t),
        "string": Point("sv", {}, {"s": s}, t),
    }[kind]


def readback(kind: str, s: str, p: Point | None):
    """What parse() gives for the one hostile item, or None when it was dropped."""
    if p is None:
        return None
    return {
        "measurement": p.measurement,
        "tag_key": next(iter(p.tags), None),
        "tag_value": p.tags.get("t"),
        "field_key": next(iter(p.fields), None),
        "string": p.fields.get("s"),
    }[kind]


def test_types_and_layout():
    line = lp.encode(
        Point("m", {"b": "2", "a": "1", "e": ""}, {"f": 1.5, "i": -3, "t": True, "n": False, "s": "x"}, 42)
    )
    assert line == b'm,a=1,b=2 f=1.5,i=-3i,t=true,n=false,s="x" 42'
    assert lineparse.parse(line) == Point(
        "m", {"a": "1", "b": "2"}, {"f": 1.5, "i": -3, "t": True, "n": False, "s": "x"}, 42
    )
    assert lp.encode(Point("m", {}, {"v": 1.0}, None)) == b"m v=1.0"
    assert lineparse.parse(b"m v=1.0").time_ns is None


@pytest.mark.parametrize(
    "x", [0.1, 1e16, 1e-7, -0.0, 5e-324, 1.7976931348623157e308, 123456789.12345679, float(2**53 + 2), 1 / 3, -2.5e-300]
)
def test_floats_round_trip_exactly(x):
    value = lineparse.parse(lp.encode(Point("m", {}, {"v": x}, 1))).fields["v"]
    assert type(value) is float and value == x and repr(value) == repr(x)


def test_nonfinite_and_out_of_range_fields_are_dropped_and_counted():
    lp.stats.clear()
    line = lp.encode(
        Point(
            "m",
            {},
            {
                "a": float("nan"),
                "b": float("inf"),
                "c": -float("inf"),
                "d": 2**63,
                "e": None,
                "f": object(),
                "ok": 2**63 - 1,
            },
            1,
        )
    )
    assert line == b"m ok=9223372036854775807i 1"
    assert lp.stats == {"nonfinite": 3, "int_range": 1, "unsupported_type": 1}
    assert lp.encode(Point("m", {"t": "x"}, {"a": float("nan")}, 1)) is None
    assert lp.stats["points"] == 1


def test_numpy_scalars_are_written_by_kind():
    line = lp.encode(Point("m", {}, {"f": np.float32(0.5), "i": np.int64(7), "g": np.float64("nan")}, 1))
    assert line == b"m f=0.5,i=7i 1"


def test_reserved_empty_and_duplicate_keys():
    lp.stats.clear()
    p = Point("m", {"time": "x", "": "y", "a\n": "1", "a\t": "2", "k": None}, {"time": 1, "": 2, "v\\": 3, "v": 4}, 1)
    assert lineparse.parse(lp.encode(p)) == Point("m", {"a ": "2"}, {"v": 3}, 1)  # "a\t" sorts first
    assert lp.stats == {"reserved_key": 2, "empty_key": 2, "duplicate_key": 2}


def test_documented_policy_examples():
    cases = [
        ("measurement", "trail\\", "trail"),
        ("measurement", "#hash", "\\#hash"),
        ("measurement", "a\\,b", "a,b"),
        ("measurement", 'a\\"b', 'a"b'),
        ("tag_value", "a\\,b", "a\\,b"),
        ("tag_value", "a\nb", "a b"),
        ("tag_value", "\\", None),
        ("tag_key", 'a\\"b', 'a\\"b'),
        ("field_key", "a\\=b", "a=b"),
        ("field_key", "a\\\\b", "a\\\\b"),
        ("string", "a\rb", "a b"),
        ("string", "a\r\nb\\", "a\r\nb\\"),
        ("string", "", ""),
        ("measurement", "lone\ud800", "lone?"),
    ]
    for kind, s, want in cases:
        assert readback(kind, s, _roundtrip(point_for(kind, s))) == want, (kind, s)


def _roundtrip(p):
    line = lp.encode(p)
    return None if line is None else lineparse.parse(line)


@pytest.mark.parametrize("kind", KINDS)
def test_property_every_hostile_string(kind):
    for s in HOSTILE:
        p = point_for(kind, s)
        line = lp.encode(p)
        want = expected(kind, s)
        if kind != "string" and (want == "" or (kind in ("tag_key", "field_key") and want == "time")):
            want = None
        got = readback(kind, s, lineparse.parse(line) if line is not None else None)
        assert got == want, (kind, s, line)
        if line is not None:
            assert b"\n" not in line or kind == "string"
            assert lp.encode(lineparse.parse(line)) == line  # encoding is idempotent
            assert lineparse.split_lines(line + b"\n" + line + b"\n") == ([line, line], b"")


def test_split_lines_keeps_quoted_newlines_and_returns_partial_rest():
    a = lp.encode(Point("m", {"t": "x y"}, {'k"q': 1, "s": 'multi\nline "q" \\', "z": 2}, 1))
    b = lp.encode(Point("n", {}, {"s": "\n"}, 2))
    lines, rest = lineparse.split_lines(a + b"\n" + b + b"\n" + b[:6])
    assert lines == [a, b] and rest == b[:6]
    assert lineparse.parse(lines[0]).fields["s"] == 'multi\nline "q" \\'


@pytest.mark.parametrize(
    "bad", [b"", b"m", b"m,t=1", b"m v=", b"m v=x 1", b'm s="open 1', b"m v=1 1x", b"m,t v=1", b"m v=nan", b"m =1"]
)
def test_parse_rejects_malformed_lines(bad):
    with pytest.raises(ValueError):
        lineparse.parse(bad)


def _ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_round_trip_through_real_influxd(influxd, fresh_db):
    """Write every hostile string in every position; influxd must store the policy's value."""
    lines = []
    for kind in KINDS:
        for i, s in enumerate(HOSTILE):
            line = lp.encode(point_for(kind, s, i))
            if line is not None:
                lines.append(line)
    influxd.write(lines, db=fresh_db)

    def want(kind, s):
        w = expected(kind, s)
        return None if w == "" and kind != "string" or w == "time" and "key" in kind else w

    names = {r["name"] for r in influxd.query("SHOW MEASUREMENTS", db=fresh_db)}
    hostile_names = {want("measurement", s) for s in HOSTILE} - {None}
    assert names == hostile_names | {"tk", "tv", "fk", "sv"}
    for name in hostile_names:  # and each is queryable by its name
        assert influxd.query(f"SELECT count(v) FROM {_ident(name)}", db=fresh_db), name

    for kind, measurement in [("tag_key", "tk"), ("tag_value", "tv"), ("field_key", "fk"), ("string", "sv")]:
        rows = {r["time"] - BASE_NS: r for r in influxd.query(f"SELECT * FROM {measurement}", db=fresh_db)}
        for i, s in enumerate(HOSTILE):
            w, p = want(kind, s), _roundtrip(point_for(kind, s, i))
            assert readback(kind, s, p) == w, (kind, s)  # our parser agrees with the server
            if kind == "tag_key":
                stored = [k for k, v in rows[i].items() if v is not None and k not in ("time", "v")]
                assert stored == ([] if w is None else [w]), (kind, s)
            elif kind == "tag_value":
                assert rows[i]["t"] == w, (kind, s)
            elif kind == "field_key":
                assert (i not in rows) if w is None else rows[i][w] == i, (kind, s)
            else:
                assert rows[i]["s"] == w, (kind, s)
