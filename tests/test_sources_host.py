"""HostSource with the real psutil of this machine, plus injected failures."""

from __future__ import annotations

import logging
from collections import namedtuple

import psutil
import pytest

from dask_influx_metrics.schema import FIELDS, HOST, WORKER
from dask_influx_metrics.worker.sources import host as host_mod
from dask_influx_metrics.worker.sources.host import HostSource

ALL = frozenset(k for k in FIELDS if k[0] == HOST) | {(WORKER, "cpu_percent"), (WORKER, "rss")}
CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")


def test_all_fields_with_schema_types():
    readings = HostSource(ALL).read()
    assert [r.measurement for r in readings] == [HOST, WORKER] and all(r.tags == {} for r in readings)
    host, worker = (r.fields for r in readings)
    optional = {"disk_read_bytes", "disk_write_bytes"}  # containers may have no disk counters
    assert set(host) - optional == {n for m, n in ALL if m == HOST} - optional
    assert set(worker) == {"cpu_percent", "rss"}
    for r in readings:
        for name, value in r.fields.items():
            assert type(value) is FIELDS[r.measurement, name].type, (r.measurement, name)
    assert 0 < host["memory_used"] <= host["memory_total"] and 0 <= host["memory_used_percent"] <= 100
    assert 0.0 <= host["cpu_percent"] <= 100.0 and worker["rss"] > 0


def test_only_requested_fields(monkeypatch):
    called = []
    for name in ("cpu_times", "disk_io_counters", "net_io_counters"):
        monkeypatch.setattr(host_mod.psutil, name, lambda *a, _n=name, **k: called.append(_n))
    src = HostSource(frozenset({(HOST, "memory_total"), (WORKER, "tasks"), ("gpu", "power_draw")}))
    (r,) = src.read()
    assert r == (HOST, {}, {"memory_total": psutil.virtual_memory().total})
    assert called == []
    assert HostSource(frozenset({(WORKER, "running")})).read() == []


def test_host_cpu_percent_from_own_deltas(monkeypatch):
    times = iter([
        CpuTimes(100, 0, 50, 850, 0, 0, 0, 0, 0, 0),   # primed at construction
        CpuTimes(130, 0, 60, 910, 0, 0, 0, 0, 0, 0),   # +40 busy of +100
        CpuTimes(130, 0, 60, 910, 0, 0, 0, 0, 0, 0),   # same tick: previous value
        CpuTimes(135, 0, 60, 1005, 10, 0, 0, 0, 5, 0),  # busy 5 of 110: iowait is idle, guest already in user
    ])
    monkeypatch.setattr(host_mod.psutil, "cpu_times", lambda: next(times))
    src = HostSource(frozenset({(HOST, "cpu_percent")}))
    assert [src.read()[0].fields["cpu_percent"] for _ in range(3)] == [40.0, 40.0, 4.5]


class BrokenProcess:
    def cpu_percent(self, interval=None):
        raise psutil.AccessDenied(pid=1)

    def memory_info(self):
        raise psutil.NoSuchProcess(pid=1)


def test_failing_process_omits_its_fields_reported_once(caplog):
    src = HostSource(ALL, process=BrokenProcess())
    for _ in range(3):
        readings = src.read()
        assert [r.measurement for r in readings] == [HOST]
        assert "memory_total" in readings[0].fields
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2  # cpu_percent and rss, once each
    assert any("worker cpu_percent" in w and "AccessDenied" in w for w in warnings)
    assert any("worker rss" in w for w in warnings)


def test_missing_disk_counters_omitted(monkeypatch, caplog):
    monkeypatch.setattr(host_mod.psutil, "disk_io_counters", lambda *a, **k: None)

    def no_net(*a, **k):
        raise OSError("no /proc/net/dev")

    monkeypatch.setattr(host_mod.psutil, "net_io_counters", no_net)
    src = HostSource(ALL)
    for _ in range(2):
        host = src.read()[0].fields
        assert not {"disk_read_bytes", "disk_write_bytes", "net_recv_bytes", "net_sent_bytes"} & set(host)
        assert "memory_used" in host and "cpu_percent" in host
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 2


def test_worker_cpu_percent_primed(monkeypatch):
    class Proc:
        calls = 0

        def cpu_percent(self, interval=None):
            assert interval is None  # never blocks
            Proc.calls += 1
            return 150 if Proc.calls > 1 else 0.0  # psutil's first call is meaningless

        def memory_info(self):
            return psutil.Process().memory_info()

    src = HostSource(frozenset({(WORKER, "cpu_percent")}), process=Proc())
    assert src.read()[0].fields == {"cpu_percent": 150.0}
