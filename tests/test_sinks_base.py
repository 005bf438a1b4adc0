"""The Sink protocol: every sink implements all of it, FanOut passes each call on, health points come from
each sink's own delivery fields, and nothing in the package asks a sink what it can do."""

from __future__ import annotations

import ast
import inspect
import os
import pathlib

import pytest

from dask_influx_metrics import schema
from dask_influx_metrics.link.outbox import Outbox
from dask_influx_metrics.sinks import FanOut, HttpOptions, HttpSink, Sink, SpoolSink, UdpSink, health_points
from dask_influx_metrics.sinks.journal import JournaledHttpSink
from dask_influx_metrics.sinks.replay import _KeptInFile

PKG = pathlib.Path(__file__).resolve().parents[1] / "dask_influx_metrics"
SINKS = [UdpSink, HttpSink, JournaledHttpSink, SpoolSink, FanOut, Outbox, _KeptInFile]
METHODS = [name for name, _ in inspect.getmembers(Sink, inspect.isfunction) if not name.startswith("_")]


def test_the_protocol_is_send_take_flush_close_counters_delivery():
    assert sorted(METHODS) == ["close", "counters", "delivery", "flush", "send", "take"]


@pytest.mark.parametrize("cls", SINKS, ids=lambda c: c.__name__)
def test_every_sink_implements_every_method_of_the_protocol(cls):
    for name in METHODS:
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}()"
    assert list(inspect.signature(cls.flush).parameters) == ["self", "drain"]
    assert inspect.signature(cls.flush).parameters["drain"].default == 0.0


def _sinks(tmp_path):
    """One of each, with something sent through (HTTP to a port nobody listens on: kept in its fallback)."""
    udp = UdpSink(("127.0.0.1", 9))
    spool = SpoolSink(tmp_path / "spool")
    http = HttpSink(
        "http://127.0.0.1:1", "db", HttpOptions(timeout=1, flush_interval=0.0), fallback=SpoolSink(tmp_path / "u")
    )
    os.makedirs(tmp_path / "run")
    outbox = Outbox(str(tmp_path / "run"), "w1")
    fan = FanOut([udp, spool, http, outbox])
    fan.send([b"m v=1i 1", b"m v=2i 2"])
    fan.flush(drain=5.0)  # the HTTP sink's queue handled (given up on: the fallback has it), all on disk
    return fan


def test_fan_out_passes_every_call_on_and_each_sink_counts_itself(tmp_path):
    fan = _sinks(tmp_path)
    try:
        counters = {c["kind"]: c for c in fan.counters()}
        assert list(counters) == ["udp", "spool", "http", "outbox"]
        assert counters["spool"] == {"kind": "spool", "points_written": 2, "points_dropped": 0}
        assert counters["http"]["points_failed"] == 2 and counters["http"]["points_spooled"] == 2
        assert counters["outbox"] == {"kind": "outbox", "points_written": 2, "points_spilled": 0, "points_dropped": 0}
        # the outbox's lines are delivered by the host's agent, in its own sink's points
        assert [d["sink"] for d in fan.delivery()] == ["udp", "spool", "http"]
    finally:
        fan.close()


class Taking:
    """Takes at most ``most`` lines of each call; what it is sent, it keeps (and counts as dropped where it
    could not take)."""

    def __init__(self, most):
        self.most, self.taken, self.sent = most, [], []

    def take(self, lines):
        self.taken += lines[: self.most]
        return min(self.most, len(lines))

    def send(self, lines):
        self.sent += lines


def test_fan_out_takes_what_its_best_sink_takes_and_sends_the_difference_to_the_others():
    """Issue 43: a FanOut (udp beside a spool on a full disk) has a line when one of its sinks has it; a sink
    that took fewer is sent the rest, counting it where it fails; no sink gets a line twice."""
    lines = [b"m v=%di %d" % (i, i) for i in range(5)]
    few, many = Taking(1), Taking(3)
    assert FanOut([few, many]).take(lines) == 3
    assert (few.taken, few.sent) == (lines[:1], lines[1:3]) and (many.taken, many.sent) == (lines[:3], [])


def test_health_points_are_each_sinks_own_delivery_fields(tmp_path):
    from dask_influx_metrics import lineparse

    fan = _sinks(tmp_path)
    fan.close()
    points = [lineparse.parse(line) for line in health_points(fan, {"host": "h", "worker": "agent-h"}, 7)]
    assert [p.tags["sink"] for p in points] == ["udp", "spool", "http"]
    assert all(set(p.fields) == set(schema.DELIVERY_FIELDS) and p.time_ns == 7 for p in points)
    spool, http = points[1].fields, points[2].fields
    assert (spool["points_sent"], spool["points_dropped"]) == (2, 0)
    # failed, and on disk for replay: spooled, not dropped
    assert (http["points_sent"], http["points_spooled"], http["points_dropped"], http["errors"]) == (0, 2, 0, 1)


# what callers probed sinks for (``close`` and ``send`` are left out: other objects have them too)
PROBED = {"flush", "drain", "counters", "delivery", "sinks", "fallback", "pending", "max_pending"}


def test_nothing_in_the_package_asks_a_sink_what_it_can_do():
    """No ``getattr``/``hasattr`` with a sink's method or counter name: every sink implements the protocol."""
    probes = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and (node.args[1].value in PROBED or node.args[1].value.startswith("points_"))
            ):
                probes.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert probes == []


def test_no_module_dispatches_on_a_sink_class_name():
    found = [str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py") if 'removesuffix("Sink")' in p.read_text()]
    assert found == []
