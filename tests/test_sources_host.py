"""HostSource with the real /proc and psutil of this machine, plus injected failures; one host writer."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections import Counter, namedtuple

import psutil
import pytest

from dask_influx_metrics.schema import FIELDS, HOST, WORKER
from dask_influx_metrics.worker.sources import host as host_mod
from dask_influx_metrics.worker.sources.host import HostSource
from dask_influx_metrics.worker.sources.procfs import ProcReader, available

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
    src = HostSource(frozenset({(HOST, "memory_total"), (WORKER, "tasks"), ("gpu", "power_draw")}), procfs=False)
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
    src = HostSource(frozenset({(HOST, "cpu_percent")}), procfs=False)
    assert [src.read()[0].fields["cpu_percent"] for _ in range(3)] == [40.0, 40.0, 4.5]


class BrokenProcess:
    def cpu_percent(self, interval=None):
        raise psutil.AccessDenied(pid=1)

    def memory_info(self):
        raise psutil.NoSuchProcess(pid=1)


def test_failing_process_omits_its_fields_reported_once(caplog):
    src = HostSource(ALL, process=BrokenProcess(), procfs=False)
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
    src = HostSource(ALL, procfs=False)
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

    src = HostSource(frozenset({(WORKER, "cpu_percent")}), process=Proc(), procfs=False)
    assert src.read()[0].fields == {"cpu_percent": 150.0}


def test_all_fields_with_psutil_too():
    readings = HostSource(ALL, procfs=False).read()
    assert [r.measurement for r in readings] == [HOST, WORKER]
    assert {"memory_used", "net_recv_bytes"} <= set(readings[0].fields) and readings[1].fields["rss"] > 0


needs_proc = pytest.mark.skipif(not available(), reason="no Linux /proc")


@needs_proc
def test_procfs_values_equal_psutils_definitions():
    reader, proc = ProcReader(os.getpid()), psutil.Process()
    vm, mem = psutil.virtual_memory(), reader.memory()
    assert mem["memory_total"] == vm.total
    assert abs(mem["memory_used"] - vm.used) < 64 << 20  # read a moment apart: other processes allocate
    assert abs(mem["memory_used_percent"] - vm.percent) <= 1.0
    busy, total = reader.cpu_busy_total()
    p_busy, p_total = host_mod._busy_total(psutil.cpu_times())
    assert 0 <= p_total - total < 1.0 * psutil.cpu_count() and 0 <= p_busy - busy < 1.0 * psutil.cpu_count()
    for ours, theirs in ((reader.disk(), psutil.disk_io_counters()), (reader.net(), psutil.net_io_counters())):
        if theirs is None:
            continue
        names = [n for n in ours]
        got = [ours[n] for n in names]
        want = [theirs.read_bytes, theirs.write_bytes] if "disk_read_bytes" in ours else [theirs.bytes_recv,
                                                                                           theirs.bytes_sent]
        assert all(0 <= w - g < 1 << 20 for g, w in zip(got, want)), (names, got, want)  # counters only grow
    assert abs(reader.process_rss() - proc.memory_info().rss) < 1 << 20
    cpu = proc.cpu_times()
    assert 0 <= cpu.user + cpu.system - reader.process_cpu_seconds() < 0.1
    reader.close()


@needs_proc
def test_worker_cpu_percent_like_psutil():
    src, proc = HostSource(frozenset({(WORKER, "cpu_percent")})), psutil.Process()
    proc.cpu_percent(None)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # one core busy: ~100
        pass
    ours, theirs = src.read()[0].fields["cpu_percent"], proc.cpu_percent(None)
    assert 60 <= ours <= 110 and abs(ours - theirs) < 15, (ours, theirs)


@pytest.fixture
def sleeper():
    """A live process other than this one, standing in for a second worker's pid."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("procfs", [True, False])
def test_host_written_once_per_host_and_taken_over_when_the_writer_leaves(tmp_path, sleeper, procfs):
    first = HostSource(ALL, share_dir=str(tmp_path), procfs=procfs)
    second = HostSource(ALL, process=sleeper, share_dir=str(tmp_path), procfs=procfs)  # another worker
    for _ in range(2):
        a, b = first.read(), second.read()
        assert [r.measurement for r in a] == [HOST, WORKER], "the first to ask writes the host"
        assert [r.measurement for r in b] == [WORKER] and b[0].fields["rss"] > 0, "the other: its own fields"
    first.close()
    taken = second.read()
    assert [r.measurement for r in taken] == [HOST, WORKER]
    assert "cpu_percent" not in taken[0].fields and "memory_used" in taken[0].fields, "cpu primed on takeover"
    assert "cpu_percent" in second.read()[0].fields
    assert [r.measurement for r in HostSource(ALL, share_dir=str(tmp_path)).read()] == [WORKER]
    second.close()


def test_host_lock_released_by_an_exiting_process(tmp_path):
    code = ("import sys; from dask_influx_metrics.worker.gpushare import HostOwner; "
            "o = HostOwner(sys.argv[1]); print(o.owns(), flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "True"
        src = HostSource(ALL, share_dir=str(tmp_path))
        assert [r.measurement for r in src.read()] == [WORKER]
    finally:
        proc.stdin.close()
        proc.wait()
    assert [r.measurement for r in src.read()] == [HOST, WORKER], "the writer died: the next sample takes over"
    src.close()


def counting(src: HostSource) -> Counter:
    """Count the reads of each (measurement, group) of ``src`` from now on."""
    calls = Counter()
    for key, call in src._calls.items():
        src._calls[key] = lambda key=key, call=call: calls.update([key[0]]) or call()
    return calls


def test_host_counters_are_repeated_between_refreshes_and_read_again_after():
    src = HostSource(ALL, refresh=0.2)
    calls = counting(src)
    first = [r.fields for r in src.read()]
    readings = [[r.fields for r in src.read()] for _ in range(3)]
    assert all(host == first[0] for host, _ in readings), "within the refresh interval the host reading is repeated"
    assert calls == {HOST: 4, WORKER: 2 * 4}, "the host groups read once, the worker's at every read"
    deadline = time.monotonic() + 5
    while calls[HOST] == 4 and time.monotonic() < deadline:
        src.read()
    assert calls[HOST] == 8, "after the interval the host is read again"


def test_refresh_falls_on_the_sample_nearest_to_the_setting():
    assert host_mod.refresh_seconds(200, 50) == pytest.approx(0.175)  # every 4th sample at 50 ms
    assert host_mod.refresh_seconds(200, 100) == pytest.approx(0.15)  # every 2nd
    assert host_mod.refresh_seconds(200, 200) == host_mod.refresh_seconds(200, 1000) == 0.0  # every sample
