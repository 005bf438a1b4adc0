"""One writer per physical GPU and one for the host, tagged with the jobs of every worker using it.

NVML's device readings are device-wide and the ``host`` readings host-wide.
When several workers of a host would each write them, each tagged with its own
jobs only, the same series would be written many times and a job running on
one worker would be charged for what another worker's job did. Instead, the
workers of one host (and one OS user) coordinate through a private folder,
``<run dir>/<session>/``:

* Every sampler publishes what its worker runs (the jobs and DAGs of its
  executing tasks, its last job, and the UUIDs of the GPUs it uses) in
  ``workers/<pid>.act`` (:class:`HostPeers`, a seqlocked shared buffer,
  :class:`~.sidecar.SnapshotBuffer`), once per sample and only when that
  changed; ``<pid>`` is the worker's, also when a sidecar samples for it.
* Of the workers that use a GPU, the one holding ``flock`` on ``<uuid>.lock``
  owns it and writes its device-wide fields (:class:`HostDevices`); whoever
  holds ``host.lock`` writes the ``host`` measurement (:class:`HostOwner`).
  The kernel drops a lock when its holder exits, so another worker takes over
  at its next sample. Which worker owns what is not significant; that it is one is.
* An owner tags its points with the union of the jobs and DAGs executing on all
  live workers that use the GPU (for the host: all live workers of the host in
  the session): ``dag="0"`` only when none of them runs a task, and then the
  owner's own last job. The owner reads its peers' buffers (one ``listdir``
  and one read per peer) once per sample, for the GPUs and the host together;
  the others only publish.

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
>>> a.peers.tags()          # the host: every worker of it
('2', '5')
>>> b.close(); a.close()
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import logging
import os
import tempfile

from .. import jobtags
from .sidecar import SnapshotBuffer
from ..sinks.spool import private_folder

logger = logging.getLogger(__name__)

BUFFER_BYTES = 1 << 16  # ~8,000 job and DAG numbers; tmpfs allocates only what is written
_instances = itertools.count()
_in_use: set[str] = set()  # files published by this process: several samplers (threads as workers) get one each


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


def _pid_of(name: str) -> int | None:
    """``1234.act`` or ``1234.2.act`` (a second sampler of process 1234) -> 1234."""
    head = name.split(".")[0]
    return int(head) if name.endswith(".act") and head.isdigit() else None


class HostPeers:
    """What every worker of this host runs, published and read in ``<directory>/workers/``.

    ``pid`` is the worker's process id (default this process). :meth:`publish`
    records this worker's state; :meth:`tags` is the union over the live
    workers (of one GPU with ``uuid``, else of the host). Peers' states are read
    once after each :meth:`publish` and kept until the next one.
    """

    def __init__(self, directory: str, pid: int | None = None):
        self.directory, self.pid = directory, pid or os.getpid()
        self._workers = os.path.join(directory, "workers")
        os.makedirs(self._workers, mode=0o700, exist_ok=True)
        self._path = os.path.join(self._workers, f"{self.pid}.act")
        if self._path in _in_use:  # another sampler of this process publishes there
            self._path = os.path.join(self._workers, f"{self.pid}.{next(_instances)}.act")
        _in_use.add(self._path)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, BUFFER_BYTES)
        self._mine, self._open = SnapshotBuffer(fd, BUFFER_BYTES, writable=True), True
        self._peers: dict[str, SnapshotBuffer] = {}  # file name -> its buffer
        self._last = None
        self._cache: dict | None = None
        self.uuids: list[str] = []
        self.state = {"jobs": [], "dags": [], "last": 0}
        self.publish(set(), set())

    def use(self, uuids) -> None:
        """The GPUs this worker uses (published with its state)."""
        self.uuids = list(uuids)
        self._last = None
        self.publish(set(self.state["jobs"]), set(self.state["dags"]), self.state["last"])

    def publish(self, jobs, dags, last_job: int = 0) -> None:
        """Record the jobs and DAGs executing on this worker now (written only when changed)."""
        state = {"jobs": sorted(j for j in jobs if j), "dags": sorted(d for d in dags if d), "last": int(last_job)}
        self._cache = None  # a new sample: read the peers again when asked
        if state == self._last:
            return
        self._last, self.state = state, state
        self._mine.write(json.dumps({**state, "uuids": self.uuids}).encode())

    def publish_activity(self, snap) -> None:
        """:meth:`publish` an :class:`~.sources.activity.Activity` (or the sidecar's copy of one)."""
        self.publish({j for _, j, _ in snap.running}, {d for _, _, d in snap.running}, snap.last_job)

    def states(self) -> dict[str, dict]:
        """File name -> published state of every live worker of the host (this one included)."""
        if self._cache is not None:
            return self._cache
        mine = os.path.basename(self._path)
        states = {mine: {**self.state, "uuids": self.uuids, "pid": self.pid}}
        for name in os.listdir(self._workers):
            pid = _pid_of(name)
            if pid is None or name == mine:
                continue
            if not _alive(pid):  # exited without cleaning up: forget it
                self._forget(name, unlink=True)
                continue
            if name not in self._peers:
                try:
                    fd = os.open(os.path.join(self._workers, name), os.O_RDONLY)
                    self._peers[name] = SnapshotBuffer(fd, BUFFER_BYTES, writable=False)
                except (OSError, ValueError):  # gone, or still being created
                    continue
            data = self._peers[name].read()
            if data:
                states[name] = {**json.loads(data), "pid": pid}
        for name in set(self._peers) - set(states):
            if not os.path.exists(os.path.join(self._workers, name)):
                self._forget(name)
        self._cache = states
        return states

    def _users(self, uuid: str | None) -> list[dict]:
        return [s for s in self.states().values() if uuid is None or uuid in s.get("uuids", ())]

    def tags(self, uuid: str | None = None) -> tuple[str, str]:
        """``(job, dag)`` tags: the union over the users of ``uuid`` (``None``: every worker of the host).

        Idle (none of them executes a task): ``dag="0"`` and this worker's last job.
        """
        users = self._users(uuid)
        jobs = {j for s in users for j in s["jobs"]}
        dags = {d for s in users for d in s["dags"]}
        return jobtags.format(jobs, idle=self.state["last"]), jobtags.format(dags)

    def pids(self, uuid: str | None = None) -> list[int]:
        """PIDs of the live workers of this host (that use ``uuid``)."""
        return sorted(s["pid"] for s in self._users(uuid))

    def _forget(self, name: str, unlink: bool = False) -> None:
        buffer = self._peers.pop(name, None)
        if buffer is not None:
            buffer.close()
        if unlink:
            try:
                os.unlink(os.path.join(self._workers, name))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Leave: remove this worker's file (its jobs no longer count). Safe to call twice."""
        for name in list(self._peers):
            self._forget(name)
        if self._open:
            self._open = False
            self._mine.close()
            _in_use.discard(self._path)
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass


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

    ``peers`` is the sampler's :class:`HostPeers` (it publishes once per sample),
    or the session's folder (see :func:`run_directory`): then this object
    publishes on its own (:meth:`publish`) as worker ``pid``. ``uuids``: the GPUs
    this worker uses.
    """

    def __init__(self, peers, uuids, pid: int | None = None):
        self.owns_peers = not isinstance(peers, HostPeers)
        self.peers = HostPeers(peers, pid) if self.owns_peers else peers
        self.directory, self.uuids, self.pid = self.peers.directory, list(uuids), self.peers.pid
        self.peers.use(self.uuids)
        self._locks: dict[str, int] = {}  # uuid -> fd of the lock file, once owned

    def publish(self, jobs, dags, last_job: int = 0) -> None:
        """Record the jobs and DAGs executing on this worker now (written only when changed)."""
        self.peers.publish(jobs, dags, last_job)

    def owns(self, uuid: str) -> bool:
        """Whether this worker writes ``uuid``'s device-wide fields (takes the lock when free)."""
        if uuid not in self._locks:
            fd = try_lock(os.path.join(self.directory, f"{uuid}.lock"))
            if fd is None:
                return False
            self._locks[uuid] = fd
        return True

    def tags(self, uuid: str) -> tuple[str, str]:
        """``(job, dag)`` tags for ``uuid``'s device-wide point: the union over its users."""
        return self.peers.tags(uuid)

    def sharers(self, uuid: str) -> list[int]:
        """PIDs of the live workers of this host that use ``uuid``."""
        return self.peers.pids(uuid)

    def close(self) -> None:
        """Release owned GPUs (another user takes over); leave the host too when publishing on its own."""
        for fd in self._locks.values():
            os.close(fd)  # releases the flock
        self._locks.clear()
        if self.owns_peers:
            self.peers.close()
