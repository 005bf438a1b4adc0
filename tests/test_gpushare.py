"""worker/gpushare.py: one writer per physical GPU on a host, tagged with every user's jobs."""

import os
import subprocess
import sys

import pytest

from dask_influx_metrics.worker import gpushare
from dask_influx_metrics.worker.gpushare import HostDevices, HostPeers


@pytest.fixture
def sleeper():
    """A live process other than this one, standing in for a second worker's pid."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_one_owner_per_gpu_and_takeover_when_it_leaves(tmp_path, sleeper):
    a = HostDevices(str(tmp_path), ["GPU-a", "GPU-b"], pid=os.getpid())
    b = HostDevices(str(tmp_path), ["GPU-a"], pid=sleeper)
    assert [a.owns("GPU-a"), b.owns("GPU-a")] == [True, False]
    assert b.owns("GPU-c")  # a GPU nobody else uses: its own
    a.close()
    assert b.owns("GPU-a"), "the lock is released when the owner leaves; the next user takes over"
    b.close()


def test_device_tags_are_the_union_of_every_user_and_idle_only_when_all_idle(tmp_path, sleeper):
    owner = HostDevices(str(tmp_path), ["GPU-a"], pid=os.getpid())
    other = HostDevices(str(tmp_path), ["GPU-a"], pid=sleeper)
    elsewhere = HostDevices(str(tmp_path), ["GPU-z"], pid=os.getppid())  # same host, another GPU
    owner.publish(set(), set(), last_job=1)
    other.publish({2}, {7})
    elsewhere.publish({9}, {9})
    assert owner.tags("GPU-a") == ("2", "7"), "job 2 runs on a worker using GPU-a: the sample is job 2's"
    owner.publish({1}, {3}, last_job=1)
    assert owner.tags("GPU-a") == ("1,2", "3,7")
    owner.publish(set(), set(), last_job=1)
    other.publish(set(), set(), last_job=2)
    assert owner.tags("GPU-a") == ("1", "0"), "idle: dag 0, never counted for a job"
    assert owner.sharers("GPU-a") == sorted([os.getpid(), sleeper])
    for h in (owner, other, elsewhere):
        h.close()


def test_a_dead_workers_file_is_forgotten(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = HostDevices(str(tmp_path), ["GPU-a"], pid=proc.pid)
    dead.publish({5}, {5})
    dead.peers._mine.close()  # the process "died": its file stays behind
    owner = HostDevices(str(tmp_path), ["GPU-a"], pid=os.getpid())
    assert owner.tags("GPU-a") == ("0", "0")
    assert not os.path.exists(os.path.join(str(tmp_path), "workers", f"{proc.pid}.act"))
    owner.close()


def test_host_tags_are_the_union_of_every_worker_of_the_host(tmp_path, sleeper):
    """The host's writer tags its points with the jobs of every live worker of the host, GPU or not."""
    writer, gpu_user, plain = (HostPeers(str(tmp_path), pid) for pid in (os.getpid(), sleeper, os.getppid()))
    HostDevices(gpu_user, ["GPU-a"])  # publishes through the sampler's peers
    writer.publish(set(), set(), last_job=4)
    assert writer.tags() == ("4", "0"), "nobody runs a task: idle, the writer's last job"
    gpu_user.publish({1}, {2})
    plain.publish({3}, {5})
    writer.publish(set(), set(), last_job=4)  # the writer's next sample reads the others again
    assert writer.tags() == ("1,3", "2,5") and writer.tags("GPU-a") == ("1", "2")
    assert writer.pids() == sorted([os.getpid(), sleeper, os.getppid()]) and writer.pids("GPU-a") == [sleeper]
    plain.close()  # a worker that leaves no longer counts
    writer.publish(set(), set(), last_job=4)
    assert writer.tags() == ("1", "2")
    for p in (writer, gpu_user):
        p.close()
    assert os.listdir(tmp_path / "workers") == []


def test_peers_are_read_once_per_sample(tmp_path, sleeper, monkeypatch):
    writer, other = HostPeers(str(tmp_path)), HostPeers(str(tmp_path), sleeper)
    calls = []
    listdir = os.listdir
    monkeypatch.setattr(gpushare.os, "listdir", lambda p: calls.append(p) or listdir(p))
    writer.publish(set(), set())
    writer.tags(), writer.tags("GPU-a"), writer.pids()
    assert len(calls) == 1, "the host's and every GPU's union come from one read of the peers"
    other.publish({2}, {2})
    assert writer.tags() == ("0", "0"), "until its next sample the writer keeps what it read"
    writer.publish(set(), set())
    assert writer.tags() == ("2", "2") and len(calls) == 2
    writer.close(), other.close()


def test_two_samplers_in_one_process_publish_apart(tmp_path):
    """Workers as threads of one process (LocalCluster(processes=False)) each have a file of their own."""
    a, b = HostPeers(str(tmp_path)), HostPeers(str(tmp_path))
    b.publish({7}, {8})
    a.publish(set(), set())
    assert a.tags() == ("7", "8") and len(os.listdir(tmp_path / "workers")) == 2
    b.close()
    a.publish(set(), set())
    assert a.tags() == ("0", "0")
    a.close()


def test_run_directory_is_private(tmp_path, monkeypatch):
    monkeypatch.setattr(gpushare.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(gpushare.os.path, "isdir", lambda p: False if p == "/dev/shm" else os.path.isdir(p))
    path = gpushare.run_directory()
    assert os.stat(path).st_mode & 0o777 == 0o700
    os.chmod(path, 0o755)
    with pytest.raises(PermissionError, match="not a private folder"):
        gpushare.run_directory()
