"""One writer per physical GPU on a host, tagged with the jobs of every worker that uses it.

NVML's device readings are device-wide. When several workers of a host use one
GPU (workers sharing a device, or plain workers that all see every GPU), each
would write the same device series, each tagged with its own jobs only, and a
job running on one worker would be charged for what another worker's job did.
Instead, the workers of one host (and one OS user) coordinate through a private
folder, ``<run dir>/<session>/``:

* Each worker publishes what it runs (the jobs and DAGs of its executing tasks,
  and the UUIDs of the GPUs it uses) in ``workers/<pid>.act``, a seqlocked
  shared buffer (:class:`~.sidecar.SnapshotBuffer`), whenever that changes.
* Of the workers that use a GPU, the one holding ``flock`` on ``<uuid>.lock``
  owns it and writes its device-wide fields. The kernel drops the lock when the
  owner exits, so another user of the GPU takes over at its next sample.
* The owner tags those points with the union of the jobs and DAGs executing
  on all live workers that use the GPU: ``dag="0"`` only when none of them runs
  a task. Which worker owns a GPU is not significant; that it is one is.
* Host-wide readings likewise: whoever holds ``host.lock`` (:class:`HostOwner`)
  writes the ``host`` measurement, tagged with its own jobs; each worker still
  writes its own ``worker`` fields.

Example
-------
>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> a = HostDevices(folder, ["GPU-1"], pid=os.getpid())
>>> b = HostDevices(folder, ["GPU-1"], pid=os.getppid())   # a second worker on the same GPU
>>> a.owns("GPU-1"), b.owns("GPU-1")
(True, False)
>>> b.publish(jobs={2}, dags={5})
>>> a.publish(jobs=set(), dags=set(), last_job=1)
>>> a.tags("GPU-1"), a.sharers("GPU-1") == sorted([os.getpid(), os.getppid()])
(('2', '5'), True)
>>> b.close(); a.close()
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import tempfile

from .. import jobtags
from .sidecar import SnapshotBuffer
from .sinks.spool import private_folder

logger = logging.getLogger(__name__)

BUFFER_BYTES = 1 << 16  # ~8,000 job and DAG numbers; tmpfs allocates only what is written


def run_directory() -> str:
    """This OS user's private folder for host-local coordination (``/dev/shm`` when present).

    Created 0700; a folder of that name owned by another user, or open to
    others, is refused with ``PermissionError`` naming it.
    """
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return private_folder(os.path.join(base, f"dask-influx-metrics-{os.getuid()}"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True


def try_lock(path: str) -> int | None:
    """An fd holding ``flock`` on ``path`` (created 0600), or None when another open file holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class HostOwner:
    """Whether this sampler writes the host's readings: one writer per host and session.

    The holder of ``flock`` on ``<directory>/host.lock`` writes the ``host``
    measurement; the others skip it. The kernel drops the lock when the holder
    exits (or :meth:`close`), and the next sampler to ask takes over.
    """

    def __init__(self, directory: str):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._path = os.path.join(directory, "host.lock")
        self._fd: int | None = None

    def owns(self) -> bool:
        if self._fd is None:
            self._fd = try_lock(self._path)
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class HostDevices:
    """This worker's share of the GPUs of its host (see the module docstring).

    ``directory`` is the session's folder (see :func:`run_directory`), ``uuids``
    the GPUs this worker uses, ``pid`` this worker's process id.
    """

    def __init__(self, directory: str, uuids, pid: int | None = None):
        self.directory, self.uuids, self.pid = directory, list(uuids), pid or os.getpid()
        self._workers = os.path.join(directory, "workers")
        os.makedirs(self._workers, mode=0o700, exist_ok=True)
        self._path = os.path.join(self._workers, f"{self.pid}.act")
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, BUFFER_BYTES)
        self._mine = SnapshotBuffer(fd, BUFFER_BYTES, writable=True)
        self._locks: dict[str, int] = {}  # uuid -> fd of the lock file, once owned
        self._peers: dict[int, SnapshotBuffer] = {}
        self._last = None
        self._state = {"jobs": [], "dags": [], "last": 0}
        self.publish(set(), set())

    def publish(self, jobs, dags, last_job: int = 0) -> None:
        """Record the jobs and DAGs executing on this worker now (written only when changed)."""
        state = {"jobs": sorted(j for j in jobs if j), "dags": sorted(d for d in dags if d), "last": int(last_job)}
        if state == self._last:
            return
        self._last, self._state = state, state
        self._mine.write(json.dumps({**state, "uuids": self.uuids}).encode())

    def owns(self, uuid: str) -> bool:
        """Whether this worker writes ``uuid``'s device-wide fields (takes the lock when free)."""
        if uuid not in self._locks:
            fd = try_lock(os.path.join(self.directory, f"{uuid}.lock"))
            if fd is None:
                return False
            self._locks[uuid] = fd
        return True

    def _states(self, uuid: str) -> dict[int, dict]:
        """pid -> published state of every live worker that uses ``uuid`` (this one included)."""
        states = {self.pid: self._state}
        for name in os.listdir(self._workers):
            pid = int(name.split(".")[0]) if name.endswith(".act") and name.split(".")[0].isdigit() else None
            if pid is None or pid == self.pid:
                continue
            if not _alive(pid):  # exited without cleaning up: forget it
                self._forget(pid, unlink=True)
                continue
            if pid not in self._peers:
                try:
                    fd = os.open(os.path.join(self._workers, name), os.O_RDONLY)
                    self._peers[pid] = SnapshotBuffer(fd, BUFFER_BYTES, writable=False)
                except (OSError, ValueError):  # gone, or still being created
                    continue
            data = self._peers[pid].read()
            state = json.loads(data) if data else None
            if state and uuid in state.get("uuids", ()):
                states[pid] = state
        for pid in set(self._peers) - set(states):
            if not os.path.exists(os.path.join(self._workers, f"{pid}.act")):
                self._forget(pid)
        return states

    def tags(self, uuid: str) -> tuple[str, str]:
        """``(job, dag)`` tags for ``uuid``'s device-wide point: the union over its users.

        Idle (no user executes a task): ``dag="0"`` and this worker's last job.
        """
        states = self._states(uuid).values()
        jobs = {j for s in states for j in s["jobs"]}
        dags = {d for s in states for d in s["dags"]}
        return jobtags.format(jobs, idle=self._state["last"]), jobtags.format(dags)

    def sharers(self, uuid: str) -> list[int]:
        """PIDs of the live workers of this host that use ``uuid``."""
        return sorted(self._states(uuid))

    def _forget(self, pid: int, unlink: bool = False) -> None:
        buffer = self._peers.pop(pid, None)
        if buffer is not None:
            buffer.close()
        if unlink:
            try:
                os.unlink(os.path.join(self._workers, f"{pid}.act"))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Leave: remove this worker's file, release owned GPUs (another user takes over)."""
        for pid in list(self._peers):
            self._forget(pid)
        self._mine.close()
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        for fd in self._locks.values():
            os.close(fd)  # releases the flock
        self._locks.clear()
