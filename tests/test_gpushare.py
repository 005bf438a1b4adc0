"""worker/gpushare.py: one writer per physical GPU on a host, tagged with every user's jobs."""

import os
import subprocess
import sys

import pytest

from dask_influx_metrics.worker import gpushare
from dask_influx_metrics.worker.gpushare import HostDevices


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
    dead._mine.close()  # the process "died": its file stays behind
    owner = HostDevices(str(tmp_path), ["GPU-a"], pid=os.getpid())
    assert owner.tags("GPU-a") == ("0", "0")
    assert not os.path.exists(os.path.join(str(tmp_path), "workers", f"{proc.pid}.act"))
    owner.close()


def test_run_directory_is_private(tmp_path, monkeypatch):
    monkeypatch.setattr(gpushare.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(gpushare.os.path, "isdir", lambda p: False if p == "/dev/shm" else os.path.isdir(p))
    path = gpushare.run_directory()
    assert os.stat(path).st_mode & 0o777 == 0o700
    os.chmod(path, 0o755)
    with pytest.raises(PermissionError, match="not a private folder"):
        gpushare.run_directory()
