"""The session's folder on one host, shared by its workers and its sampling agent.

``<run dir>/<session>/``, where the run dir is this OS user's private
``/dev/shm/dask-influx-metrics-<uid>`` (0700; the temporary directory where
there is no ``/dev/shm``)::

    start.lock          serialises agent starts, worker arrivals and the agent's exit (flock)
    agent.lock          held (flock) by the live agent for its whole life
    agent.beat          the agent's beat (:mod:`.snapshot`)
    agent.sock          the agent's wake socket (datagram: the id of a worker whose task started while idle)
    workers/<id>.json   what the agent needs of worker ``<id>``: address, pid, tags, GPUs (written once)
    workers/<id>.snap   its task snapshot (:class:`.snapshot.Publisher`)
    workers/<id>.lock   held (flock) by worker ``<id>`` for its whole life: dead or alive, whatever its pid says
    workers/<id>.out-<k>, .sent   its outbox: points only it makes, for the agent to send (:mod:`.outbox`)

Workers that cannot see one another's folder (separate containers without a
shared ``/dev/shm``) each get an agent of their own. The kernel drops a flock
when its holder dies, so a killed agent frees ``agent.lock`` at once.

Example
-------
>>> import tempfile
>>> root = tempfile.mkdtemp(); folder = os.path.join(root, "s1")
>>> with locked(folder, START_LOCK):
...     held = try_lock(folder, AGENT_LOCK)
>>> held is not None, try_lock(folder, AGENT_LOCK) is None
(True, True)
>>> os.close(held); remove_session(folder); os.path.exists(folder)
False
>>> os.rmdir(root)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import tempfile

from ..sinks.paths import safe_name
from ..sinks.spool import make_private_dirs, private_folder
from . import outbox
from .snapshot import BEAT_BYTES, BUFFER_BYTES

START_LOCK, AGENT_LOCK, BEAT, SOCKET, WORKERS = "start.lock", "agent.lock", "agent.beat", "agent.sock", "workers"
SMALL_SAID = "small.said"  # in the session folder: a worker said the run folder is smaller than needed


def run_directory(base: str | None = None) -> str:
    """This OS user's private folder for host-local coordination: in ``base`` (the setting ``run.directory``),
    else ``/dev/shm`` when present, else the temporary directory.

    Created 0700; a folder of that name owned by another user, or open to
    others, is refused with ``PermissionError`` naming it.
    """
    if base is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    else:
        make_private_dirs(base)  # a configured folder that is not there yet
    return private_folder(os.path.join(base, f"dask-influx-metrics-{os.getuid()}"))


def session_folder(session_id: str, base: str | None = None) -> str:
    """``<run dir>/<session>`` (not created here: see :func:`locked`)."""
    return os.path.join(run_directory(base), session_id)


def spill_folder(spool_root: str, session_id: str) -> str:
    """Where this host's outboxes of session ``session_id`` go when the run folder has no room
    (:mod:`.outbox`): ``<spool root>/<session>/outbox-<host>``, on disk (not created here)."""
    return os.path.join(spool_root, session_id, "outbox-" + safe_name(socket.gethostname()))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True


def started(pid: int | str = "self") -> int | None:
    """Process ``pid``'s start time (clock ticks since boot, ``/proc/<pid>/stat``), or None: with the pid,
    it names a process the same way in every PID namespace that sees it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def life_lock(worker_id: str) -> str:
    """The name of the lock worker ``worker_id`` holds while it lives (in ``workers/``)."""
    return f"{worker_id}.lock"


def dead(folder: str, worker_id: str) -> bool:
    """Whether worker ``worker_id`` of ``folder/workers`` is dead: its life lock exists and nobody holds it (an
    answer in every PID namespace that shares the folder). False for a worker of a version without the lock."""
    path = os.path.join(folder, WORKERS, life_lock(worker_id))
    if not os.path.exists(path):
        return False
    fd = try_lock(os.path.join(folder, WORKERS), life_lock(worker_id))
    if fd is None:
        return False
    os.close(fd)
    return True


def try_lock(folder: str, name: str) -> int | None:
    """An fd holding ``flock`` on ``folder/name`` (created 0600), or None when another open file holds it."""
    fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def locked(folder: str, name: str):
    """Hold ``flock`` on ``folder/name``, creating the folder (0700) and its ``workers/`` as needed.

    The agent removes the whole folder under this lock when it exits: whoever
    waited meanwhile holds the lock of a removed file, sees that and starts over.
    """
    while True:
        make_private_dirs(os.path.join(folder, WORKERS))  # the session folder too: 0700 (makedirs: the last only)
        path = os.path.join(folder, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)


def worker_files(folder: str) -> dict[str, str]:
    """Worker id -> its ``.json`` path, for every registered worker."""
    try:
        names = os.listdir(os.path.join(folder, WORKERS))
    except FileNotFoundError:
        return {}
    return {n[:-5]: os.path.join(folder, WORKERS, n) for n in names if n.endswith(".json")}


def check_room(folder: str, budget: int, spill: str, report) -> None:
    """Say once per host and session (``report``) when the file system of session folder ``folder`` is smaller
    than its workers need (each its snapshot and an outbox of ``budget`` bytes, and the agent's beat): their
    outboxes then go to ``spill``, on disk, sooner."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return
    workers = len(worker_files(folder))
    need, size = workers * (BUFFER_BYTES + budget) + BEAT_BYTES, st.f_blocks * st.f_frsize
    said = os.path.join(folder, SMALL_SAID)
    if size >= need or os.path.exists(said):
        return
    try:
        os.close(os.open(said, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:  # said by another worker just now
        return
    report(
        "run-folder",
        f"the run folder's file system ({os.path.dirname(os.path.dirname(folder))}) holds {size >> 10} KiB; "
        f"this host's {workers} worker(s) need {need >> 10} KiB there (task snapshot and run.outbox-budget "
        f"each, and the agent's beat), shared with whatever else uses it: when it is full their outboxes go to "
        f"{spill} (give it more room, e.g. docker --shm-size, "
        "or lower run.outbox-budget)",
        size=size,
        needed=need,
    )


def read_worker(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):  # gone, or being replaced
        return None


def write_worker(folder: str, worker_id: str, info: dict) -> str:
    """Register worker ``worker_id`` (atomically: the agent never reads half a file)."""
    path = os.path.join(folder, WORKERS, f"{worker_id}.json")
    tmp = f"{path}.{os.getpid()}.new"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)
    return path


def _worker_pids(folder: str) -> set[int]:
    """The pids in the names of ``workers/<pid>[.<n>].<suffix>`` (this version's and older ones' files)."""
    try:
        names = os.listdir(os.path.join(folder, WORKERS))
    except OSError:
        return set()
    return {int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit()}


def remove_session(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def remove_stale(run_dir: str, keep: str = "", rescue: str | None = None, spill: str | None = None) -> list[str]:
    """Remove the session folders of ``run_dir`` that no agent holds and no live worker is in
    (sessions whose processes were killed); returns them. ``keep``: a session name left alone.
    ``rescue``: a folder their workers' outboxes move into first (as ``stale-<session>-<id>``), for the agent
    there to send what they hold: the only copy of those points is never removed. ``spill``: the rescuing
    agent's spill folder (:func:`spill_folder`): the segments their outboxes had on disk move there."""
    removed = []
    for name in os.listdir(run_dir):
        folder = os.path.join(run_dir, name)
        if name == keep or not os.path.isdir(folder) or os.path.islink(folder):
            continue
        try:
            held = [try_lock(folder, START_LOCK), try_lock(folder, AGENT_LOCK)]
        except OSError:  # not ours to lock (another layout): leave it
            continue
        if None not in held:  # no worker arriving, no agent
            if not any(alive(pid) for pid in _worker_pids(folder)) and _rescued(folder, name, rescue, spill):
                remove_session(folder)
                removed.append(folder)
        for fd in held:
            if fd is not None:
                os.close(fd)
    return removed


def _rescued(folder: str, name: str, into: str | None, spill: str | None) -> bool:
    """Whether the outboxes of session folder ``folder`` are in ``into`` now (or there is none to move)."""
    workers = os.path.join(folder, WORKERS)
    # that session's spill folder: beside this one's, under the same spool root
    old_spill = (
        None if spill is None else os.path.join(os.path.dirname(os.path.dirname(spill)), name, os.path.basename(spill))
    )
    try:
        for wid in outbox.ids(workers):
            if into is None:
                return False
            new_id = f"{outbox.STALE}{name}-{wid}"
            outbox.move(workers, wid, into, new_id)
            if old_spill is not None and os.path.isdir(old_spill):
                make_private_dirs(spill)
                outbox.move(old_spill, wid, spill, new_id)
    except FileNotFoundError:  # no workers folder
        return True
    except OSError:  # left for a later agent to move
        return False
    if old_spill is not None:
        try:
            os.rmdir(old_spill)
            os.rmdir(os.path.dirname(old_spill))  # its spool session folder, if nothing else is there
        except OSError:
            pass
    return True
