"""HostSource with the real /proc and psutil of this machine, plus injected failures; another process's fields."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections import Counter, namedtuple

import psutil
import pytest

from dask_influx_metrics.sampling.sources import host as host_mod
from dask_influx_metrics.sampling.sources.host import HostSource
from dask_influx_metrics.sampling.sources.procfs import ProcReader, available
from dask_influx_metrics.schema import FIELDS, HOST, WORKER

ALL = frozenset(k for k in FIELDS if k[0] == HOST) | {(WORKER, "cpu_percent"), (WORKER, "rss")}
CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")


def test_all_fields_with_schema_types():
    src = HostSource(ALL)
    host, worker = src.read(HOST), src.read(WORKER)
    optional = {"disk_read_bytes", "disk_write_bytes"}  # containers may have no disk counters
    optional |= {"cpu_percent_core_max", "cpu_percent_core_min"}  # read in the clock tick it was primed in
    assert set(host) - optional == {n for m, n in ALL if m == HOST} - optional
    assert set(worker) == {"cpu_percent", "rss"}
    for measurement, fields in ((HOST, host), (WORKER, worker)):
        for name, value in fields.items():
            assert type(value) is FIELDS[measurement, name].type, (measurement, name)
    assert 0 < host["memory_used"] <= host["memory_total"] and 0 <= host["memory_used_percent"] <= 100
    assert 0.0 <= host["cpu_percent"] <= 100.0 and worker["rss"] > 0


def test_only_requested_fields(monkeypatch):
    called = []
    for name in ("cpu_times", "disk_io_counters", "net_io_counters"):
        monkeypatch.setattr(host_mod.psutil, name, lambda *a, _n=name, **k: called.append(_n))
    src = HostSource(frozenset({(HOST, "memory_total"), (WORKER, "tasks"), ("gpu", "power_draw")}), procfs=False)
    assert src.read(HOST) == {"memory_total": psutil.virtual_memory().total}
    assert src.read(WORKER) == {}  # tasks: not a host or process field
    assert called == []
    none = HostSource(frozenset({(WORKER, "running")}))
    assert none.read(HOST) == {} and none.read(WORKER) == {}


def test_host_cpu_percent_from_own_deltas(monkeypatch):
    times = iter(
        [
            CpuTimes(100, 0, 50, 850, 0, 0, 0, 0, 0, 0),  # primed at construction
            CpuTimes(130, 0, 60, 910, 0, 0, 0, 0, 0, 0),  # +40 busy of +100
            CpuTimes(130, 0, 60, 910, 0, 0, 0, 0, 0, 0),  # same tick: previous value
            CpuTimes(135, 0, 60, 1005, 10, 0, 0, 0, 5, 0),  # busy 5 of 110: iowait is idle, guest already in user
        ]
    )
    monkeypatch.setattr(host_mod.psutil, "cpu_times", lambda: next(times))
    src = HostSource(frozenset({(HOST, "cpu_percent")}), procfs=False)
    assert [src.read(HOST)["cpu_percent"] for _ in range(3)] == [40.0, 40.0, 4.5]


class BrokenProcess:
    pid = 1  # a psutil.Process has one

    def cpu_percent(self, interval=None):
        raise psutil.AccessDenied(pid=1)

    def memory_info(self):
        raise psutil.NoSuchProcess(pid=1)


def test_failing_process_omits_its_fields_reported_once(caplog):
    src = HostSource(ALL, process=BrokenProcess(), procfs=False)
    for _ in range(3):
        assert src.read(WORKER) == {}
        assert "memory_total" in src.read(HOST)
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
        host = src.read(HOST)
        assert not {"disk_read_bytes", "disk_write_bytes", "net_recv_bytes", "net_sent_bytes"} & set(host)
        assert "memory_used" in host and "cpu_percent" in host
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 2


def test_worker_cpu_percent_primed(monkeypatch):
    class Proc:
        calls, pid = 0, os.getpid()

        def cpu_percent(self, interval=None):
            assert interval is None  # never blocks
            Proc.calls += 1
            return 150 if Proc.calls > 1 else 0.0  # psutil's first call is meaningless

        def memory_info(self):
            return psutil.Process().memory_info()

    src = HostSource(frozenset({(WORKER, "cpu_percent")}), process=Proc(), procfs=False)
    assert src.read(WORKER) == {"cpu_percent": 150.0}


def test_all_fields_with_psutil_too():
    src = HostSource(ALL, procfs=False)
    assert {"memory_used", "net_recv_bytes"} <= set(src.read(HOST)) and src.read(WORKER)["rss"] > 0


needs_proc = pytest.mark.skipif(not available(), reason="no Linux /proc")


@needs_proc
def test_procfs_values_equal_psutils_definitions():
    reader, proc = ProcReader(os.getpid()), psutil.Process()
    vm, mem = psutil.virtual_memory(), reader.memory()
    assert mem["memory_total"] == vm.total
    assert abs(mem["memory_used"] - vm.used) < 64 << 20  # read a moment apart: other processes allocate
    assert abs(mem["memory_used_percent"] - vm.percent) <= 1.0
    (busy, total), cores = reader.cpu_times(cores=True)
    assert len(cores) == psutil.cpu_count()
    p_busy, p_total = host_mod._busy_total(psutil.cpu_times())
    assert 0 <= p_total - total < 1.0 * psutil.cpu_count() and 0 <= p_busy - busy < 1.0 * psutil.cpu_count()
    for ours, theirs in (
        (reader.disk(), psutil.disk_io_counters(nowrap=False)),
        (reader.net(), psutil.net_io_counters(nowrap=False)),
    ):
        if theirs is None:
            continue
        names = [n for n in ours]
        got = [ours[n] for n in names]
        want = (
            [theirs.read_bytes, theirs.write_bytes]
            if "disk_read_bytes" in ours
            else [theirs.bytes_recv, theirs.bytes_sent]
        )
        assert all(0 <= w - g < 1 << 20 for g, w in zip(got, want)), (names, got, want)  # counters only grow
    before = proc.cpu_times()  # ours read between two of psutil's: a clock tick may pass between reads
    ours, rss = reader.process()
    after = proc.cpu_times()
    assert abs(rss - proc.memory_info().rss) < 1 << 20
    assert before.user + before.system - 1e-9 <= ours <= after.user + after.system + 1e-9
    assert after.user + after.system - ours < 0.1
    reader.close()


@needs_proc
def test_worker_cpu_percent_like_psutil():
    src, proc = HostSource(frozenset({(WORKER, "cpu_percent")})), psutil.Process()
    proc.cpu_percent(None)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # one core busy: ~100
        pass
    ours, theirs = src.read(WORKER)["cpu_percent"], proc.cpu_percent(None)
    assert 60 <= ours <= 110 and abs(ours - theirs) < 15, (ours, theirs)


@pytest.fixture
def sleeper():
    """A live process other than this one, standing in for a second worker's pid; started and asleep."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()
    proc.stdout.close()


@pytest.mark.parametrize("procfs", [True, False])
def test_worker_fields_of_another_process(sleeper, procfs):
    src = HostSource(ALL, pid=sleeper.pid, procfs=procfs)  # the agent reads each worker's process
    try:
        time.sleep(0.05)  # a CPU window of a sleeping process
        fields = src.read(WORKER)
        assert set(fields) == {"cpu_percent", "rss"}
        assert abs(fields["rss"] - sleeper.memory_info().rss) < 1 << 20  # the sleeper's, not this process's
        assert 0.0 <= fields["cpu_percent"] < 50.0  # it sleeps
        assert "memory_used" in src.read(HOST)
    finally:
        src.close()


def counting(src: HostSource) -> Counter:
    """Count the reads of each (measurement, group) of ``src`` from now on."""
    calls = Counter()
    for key, call in src._calls.items():
        src._calls[key] = lambda key=key, call=call: calls.update([key[0]]) or call()
    if src._proc is not None:  # a worker process on /proc: its groups in one call
        process = src._proc.process
        src._proc.process = lambda: calls.update([WORKER]) or process()
    return calls


def test_host_counters_are_repeated_between_refreshes_and_read_again_after():
    src = HostSource(ALL, refresh=0.2)
    calls = counting(src)
    first = src.read(HOST)
    src.read(WORKER)
    readings = [(src.read(HOST), src.read(WORKER)) for _ in range(3)]
    assert all(host == first for host, _ in readings), "within the refresh interval the host reading is repeated"
    assert calls == {HOST: 4, WORKER: 4}, "the host groups read once, the worker's process at every read"
    deadline = time.monotonic() + 5
    while calls[HOST] == 4 and time.monotonic() < deadline:
        src.read(HOST)
    assert calls[HOST] == 8, "after the interval the host is read again"


def test_refresh_falls_on_the_sample_nearest_to_the_setting():
    assert host_mod.refresh_seconds(200, 50) == pytest.approx(0.175)  # every 4th sample at 50 ms
    assert host_mod.refresh_seconds(200, 100) == pytest.approx(0.15)  # every 2nd
    assert host_mod.refresh_seconds(200, 200) == host_mod.refresh_seconds(200, 1000) == 0.0  # every sample


# --- issue 47: the spread across cores, the network split loopback / external ----------------------
def _spin_pinned(core: int, seconds: float) -> None:
    os.sched_setaffinity(0, {core})  # this thread only
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@needs_proc
@pytest.mark.parametrize("procfs", [True, False])
def test_a_thread_pinned_to_one_core_reads_100_there_as_psutil_does(procfs):
    import threading

    core = psutil.cpu_count() - 1
    src = HostSource(
        frozenset({(HOST, "cpu_percent"), (HOST, "cpu_percent_core_max"), (HOST, "cpu_count")}), procfs=procfs
    )
    psutil.cpu_percent(percpu=True)
    spinner = threading.Thread(target=_spin_pinned, args=(core, 0.4))
    spinner.start()
    spinner.join()
    ours, theirs = src.read(HOST), psutil.cpu_percent(percpu=True)
    assert ours["cpu_count"] == psutil.cpu_count() == len(theirs)
    assert ours["cpu_percent_core_max"] >= 95 and theirs[core] >= 95  # the pinned core, whatever else ran
    assert (
        abs(ours["cpu_percent_core_max"] - max(theirs)) <= 5
        and abs(ours["cpu_percent"] - sum(theirs) / len(theirs)) <= 5
    )
    assert "cpu_percent_core_min" not in ours  # not asked for


def test_core_spread_from_per_core_times(monkeypatch):
    per_core = iter(
        [
            [CpuTimes(0, 0, 0, 100, 0, 0, 0, 0, 0, 0), CpuTimes(0, 0, 0, 100, 0, 0, 0, 0, 0, 0)],  # primed
            [CpuTimes(90, 0, 10, 100, 0, 0, 0, 0, 0, 0), CpuTimes(0, 0, 5, 195, 0, 0, 0, 0, 0, 0)],  # 100 %, 5 %
        ]
    )
    totals = iter([CpuTimes(0, 0, 0, 200, 0, 0, 0, 0, 0, 0), CpuTimes(90, 0, 15, 295, 0, 0, 0, 0, 0, 0)])
    monkeypatch.setattr(host_mod.psutil, "cpu_times", lambda percpu=False: next(per_core if percpu else totals))
    fields = frozenset((HOST, f) for f in ("cpu_percent", "cpu_percent_core_max", "cpu_percent_core_min", "cpu_count"))
    assert HostSource(fields, procfs=False).read(HOST) == {
        "cpu_percent": 52.5,
        "cpu_percent_core_max": 100.0,
        "cpu_percent_core_min": 5.0,
        "cpu_count": 2,
    }


def test_loopback_by_the_kernels_flag_else_by_name(tmp_path):
    from dask_influx_metrics.sampling.sources.procfs import is_loopback

    for name, flags in (("lo", "0x9"), ("eth0", "0x1003"), ("weird", "0x49")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "flags").write_text(flags + "\n")
    assert [is_loopback(n, sys_net=str(tmp_path)) for n in ("lo", "eth0", "weird")] == [True, False, True]
    assert is_loopback("Loopback Pseudo-Interface 1", sys_net=str(tmp_path)) and not is_loopback("wlan0", str(tmp_path))


@needs_proc
def test_network_split_equals_psutils_per_interface_counters():
    from dask_influx_metrics.sampling.sources.procfs import is_loopback

    nics = psutil.net_io_counters(pernic=True, nowrap=False)
    ours = ProcReader(os.getpid()).net()
    for fields in (ours, HostSource(frozenset((HOST, f) for f in ours), procfs=False).read(HOST)):
        for kind, lo in (("lo", True), ("ext", False)):
            for d, attr in (("recv", "bytes_recv"), ("sent", "bytes_sent")):
                theirs = sum(getattr(c, attr) for n, c in nics.items() if is_loopback(n) == lo)
                assert 0 <= fields[f"net_{d}_{kind}_bytes"] - theirs < 1 << 20  # read a moment apart: only grow
        assert fields["net_recv_bytes"] == fields["net_recv_lo_bytes"] + fields["net_recv_ext_bytes"]
    assert any(is_loopback(n) for n in nics)  # lo is there
