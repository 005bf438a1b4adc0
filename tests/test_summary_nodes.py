"""Each node's resources per job (issue 47), on a real LocalCluster: the core spread of a busy loop pinned to one
core, and a job's disk and network bytes against psutil's counters read before and after it.

The machine is shared with other tests: its other cores may be busy, and other processes read and write disks and
loopback sockets. So figures are compared with what psutil saw over the same job, and the job's own traffic is
large beside what the others add in the few hundred ms at the edges of its windows."""

from __future__ import annotations

import os
import socket
import threading
import time

import psutil
import pytest
from distributed import Client, LocalCluster, get_worker

from dask_influx_metrics import Monitor, query
from dask_influx_metrics.client import summary
from dask_influx_metrics.link import runfolder
from dask_influx_metrics.sampling.sources.disks import mount_point
from dask_influx_metrics.sampling.sources.procfs import is_loopback

MIB = 1 << 20
EDGE_S = 0.6  # a task's quiet time before and after its work: the host is read every 200 ms (the default)
TRACKING = ["host-cpu", "cpu-cores", "host-mem", "disk-io", "net-io", "disk-usage", "tasks"]


def busy(seconds: float, core: int) -> int:
    """Spin on one core (this thread pinned to it), between quiet edges."""
    time.sleep(EDGE_S)
    os.sched_setaffinity(0, {core})  # Linux: the calling thread only
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    finally:
        os.sched_setaffinity(0, psutil.Process().cpu_affinity())
    time.sleep(EDGE_S)
    return core


def io(disk_mib: int, net_mib: int) -> str:
    """Write, sync, drop from the page cache and read back a file in the worker's local directory; send bytes
    through a loopback TCP connection; between quiet edges."""
    time.sleep(EDGE_S)
    path = os.path.join(get_worker().local_directory, "issue47.bin")
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        for _ in range(disk_mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read goes to the disk
        while os.read(fd, MIB):
            pass
    finally:
        os.close(fd)
        os.unlink(path)
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
        drained = threading.Thread(target=lambda: [None for _ in iter(lambda: receiver.recv(MIB), b"")])
        drained.start()
        for _ in range(net_mib):
            sender.sendall(block)
        sender.close()
        drained.join(30)
        receiver.close()
    time.sleep(EDGE_S)
    return get_worker().local_directory


def _net():
    out = {"lo_sent_bytes": 0, "lo_recv_bytes": 0, "ext_sent_bytes": 0, "ext_recv_bytes": 0}
    for name, c in psutil.net_io_counters(pernic=True).items():
        kind = "lo" if is_loopback(name) else "ext"
        out[f"{kind}_sent_bytes"] += c.bytes_sent
        out[f"{kind}_recv_bytes"] += c.bytes_recv
    return out


def _disk():
    c = psutil.disk_io_counters()
    return {"read_bytes": c.read_bytes, "write_bytes": c.write_bytes} if c is not None else None


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spool")
    cores = psutil.cpu_count()
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        monitor = Monitor(client, sink="spool", spool_directory=str(folder))
        monitor.attach(tracking=TRACKING, job_type="manual", polling_interval=100)
        monitor.start()
        try:
            seen = {}
            monitor.new_job()  # job 1: a busy loop pinned to the last core
            psutil.cpu_percent(percpu=True)
            client.submit(busy, 2.0, cores - 1, pure=False).result()
            seen["cores"] = psutil.cpu_percent(percpu=True)
            monitor.new_job()  # job 2: disk and loopback traffic
            before = _disk(), _net()
            seen["local_directory"] = client.submit(io, 64, 192, pure=False).result()
            after = _disk(), _net()
            seen["disk"] = {k: after[0][k] - before[0][k] for k in before[0]} if before[0] else None
            seen["net"] = {k: after[1][k] - before[1][k] for k in before[1]}
            monitor.stop()
            db = monitor.query()
            yield db, query.summary(db), seen
        finally:
            monitor.shutdown()


def _row(frame, resource, job):
    rows = frame[(frame["resource"] == resource) & (frame["job"] == job) & frame["worker_index"].notna()]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def test_one_pinned_core_reads_a_core_max_near_100_and_an_average_of_one_core(session):
    db, frame, seen = session
    cpu, cores = _row(frame, "cpu", 1), psutil.cpu_count()
    psutil_mean = sum(seen["cores"]) / cores
    print(
        f"job 1 cpu row: core_max {cpu['core_max']}, mean {cpu['mean']:.1f}, cores {cpu['devices']}; "
        f"psutil over the job: per core {seen['cores']}, mean {psutil_mean:.1f}"
    )
    assert cpu["devices"] == cores and cpu["device_hours"] == pytest.approx(cpu["hours"] * cores, rel=0.01)
    assert cpu["core_max"] >= 95
    assert cpu["core_min"] <= cpu["core_max"]
    # psutil's window holds the quiet edges too: its mean is lower, never much higher
    assert cpu["mean"] <= max(100 / cores + 10, psutil_mean * 1.5 + 10)
    others = [p for i, p in enumerate(seen["cores"]) if i != cores - 1]
    if max(others) < 30:  # the other cores were quiet (a shared machine: not always)
        assert cpu["mean"] <= 100 / cores + 10


def test_disk_and_network_bytes_of_a_job_match_psutils_counters(session):
    db, frame, seen = session
    net = _row(frame, "network", 2)
    for name, theirs in seen["net"].items():
        ours = net[name]
        print(f"{name}: ours {ours:.0f}, psutil {theirs}")
        if name.startswith("lo"):  # the job's 192 MiB
            assert theirs > 192 * MIB and ours == pytest.approx(theirs, rel=0.02)
        else:  # no external traffic of our own: only what others do (a few bytes, or none)
            assert ours <= theirs + 2 * MIB
    if seen["disk"] is None:
        pytest.skip("no disk counters on this machine (psutil.disk_io_counters() is None)")
    disk = _row(frame, "disk", 2)
    for name, theirs in seen["disk"].items():
        print(f"{name}: ours {disk[name]:.0f}, psutil {theirs}")
        # host-wide counters: other processes' I/O lands in both windows, which differ by up to a sample
        assert theirs >= 64 * MIB and disk[name] >= 64 * MIB and disk[name] == pytest.approx(theirs, rel=0.1)


def test_disk_usage_of_the_workers_filesystems(session):
    db, frame, seen = session
    points = db.disk_points()
    run = runfolder.run_directory()
    assert set(points["path"]) == {mount_point(seen["local_directory"]), mount_point(run)}
    fullest = max(psutil.disk_usage(p).percent for p in (seen["local_directory"], run))
    assert _row(frame, "disk", 2)["max"] == pytest.approx(fullest, abs=1.0)
    memory = _row(frame, "memory", 2)
    assert 0 < memory["mean"] <= memory["max"] + 1e-9 and memory["max"] <= 100  # a mean of equal values: float error
    assert abs(memory["max"] - psutil.virtual_memory().percent) < 10
    assert set(frame.loc[frame["resource"] != "gpu", "host"]) == {socket.gethostname()}
    assert summary.COLUMNS == list(frame.columns)
