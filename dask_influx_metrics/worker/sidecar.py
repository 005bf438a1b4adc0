"""Isolated sampling (``influx-metrics.sampler.isolate: true``): a sidecar process per worker.

Inside the worker, every psutil (``/proc``) and NVML (ctypes) call releases the
GIL and must win it back from the task threads, up to a switch interval (5 ms)
each time, so samples slip while tasks run pure Python. With ``isolate`` the
worker plugin starts this module as a child process
(``python -m dask_influx_metrics.worker.sidecar``, not ``multiprocessing``: Dask worker
processes are daemonic) that runs the :class:`~.sampler.Sampler` with the GPU
source, :class:`~.sources.host.HostSource` (reading the *worker's* pid) and the
task fields, and owns the worker's sink.

The worker only keeps its task registry: on each change (``transition``, on
the event loop, and once a second for bytes held and the clock offset) it
writes a compact JSON snapshot into a shared buffer (an anonymous ``memfd``
inherited by the sidecar, :data:`BUFFER_BYTES`) under a seqlock: the sequence
number is odd while writing, and a reader retries on an odd or changed number
or a CRC mismatch. The sidecar never calls into the worker. A snapshot too big
for the buffer lists fewer keys in ``running``; counts and tags stay exact.

Lifetime: the sidecar reads its settings as one JSON line on stdin, then
samples until stdin reaches EOF (the plugin closes it on teardown, or the worker
died), its parent changes, or SIGTERM; then it flushes its sink and exits. The
plugin waits for it (bounded, then ``terminate``/``kill``), and if it cannot
start or dies, reports once and samples in-process instead.

Example
-------
>>> from dask_influx_metrics.worker.sources.activity import TaskRegistry
>>> reg = TaskRegistry(nthreads=2)
>>> reg.started(("x", 0), job=1, dag=3)
>>> buf = SnapshotBuffer.create(4096)
>>> buf.write(encode_snapshot(reg.snapshot(), scheduler_delay=0.5))
>>> snap = decode_snapshot(buf.read())
>>> snap.running, snap.job_tag, snap.dag_tag, snap.scheduler_delay
(((('x', 0), 1, 3),), '1', '3', 0.5)
>>> buf.close()
"""

from __future__ import annotations

import dataclasses
import json
import logging
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from typing import NamedTuple

from .sources.activity import Activity, plain_key

logger = logging.getLogger(__name__)

BUFFER_BYTES = 1 << 20
_SEQ = struct.Struct("<Q")  # at offset 0: even = stable, odd = being written
_BODY = struct.Struct("<II")  # at offset 8: payload length, crc32
_HEADER = _SEQ.size + _BODY.size


class SharedActivity(NamedTuple):
    """An :class:`~.sources.activity.Activity` as the sidecar reads it: counts and tags exact,
    ``running`` possibly cut short (buffer full), plus the worker's clock offset."""

    running: tuple
    nthreads: int
    managed_bytes: int
    last_job: int
    executing: int
    job_tag: str
    dag_tag: str
    scheduler_delay: float = 0.0


IDLE = SharedActivity((), 0, 0, 0, 0, "0", "0")


def _tuples(k):
    """Inverse of :func:`plain_key` for what JSON returns: lists become tuples again."""
    return tuple(_tuples(p) for p in k) if isinstance(k, list) else k


def encode_snapshot(activity: Activity, scheduler_delay: float = 0.0, limit: int = BUFFER_BYTES) -> bytes:
    """The snapshot as compact JSON of at most ``limit`` bytes (``running`` halved until it fits)."""
    doc = {"n": activity.executing, "job": activity.job_tag, "dag": activity.dag_tag,
           "last": activity.last_job, "threads": activity.nthreads, "bytes": activity.managed_bytes,
           "delay": scheduler_delay, "running": [[plain_key(k), j, d] for k, j, d in activity.running]}
    while True:
        data = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        if len(data) <= limit:
            return data
        if not doc["running"]:
            raise ValueError(f"activity snapshot needs {len(data)} bytes with no keys; buffer holds {limit}")
        doc["running"] = doc["running"][:len(doc["running"]) // 2]


def decode_snapshot(data: bytes | None) -> SharedActivity:
    if not data:
        return IDLE
    d = json.loads(data)
    return SharedActivity(tuple((_tuples(k), j, g) for k, j, g in d["running"]), d["threads"], d["bytes"],
                          d["last"], d["n"], d["job"], d["dag"], d["delay"])


class SnapshotBuffer:
    """One writer, any readers, over a shared mapping of file descriptor ``fd`` (seqlock + CRC)."""

    def __init__(self, fd: int, size: int, writable: bool):
        self.fd, self.size, self.capacity = fd, size, size - _HEADER
        self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        self._seq = _SEQ.unpack_from(self._mm, 0)[0]

    @classmethod
    def create(cls, size: int = BUFFER_BYTES) -> "SnapshotBuffer":
        """A new zeroed buffer in anonymous memory (an unlinked temporary file without memfd)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("influx-metrics-activity")
        else:
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        os.ftruncate(fd, size)
        return cls(fd, size, writable=True)

    def write(self, data: bytes) -> None:
        if len(data) > self.capacity:
            raise ValueError(f"{len(data)} bytes do not fit in {self.capacity}")
        mm, seq = self._mm, self._seq + 1
        _SEQ.pack_into(mm, 0, seq)  # odd: readers retry
        mm[_HEADER:_HEADER + len(data)] = data
        _BODY.pack_into(mm, _SEQ.size, len(data), zlib.crc32(data))
        _SEQ.pack_into(mm, 0, seq + 1)
        self._seq = seq + 1

    def read(self, tries: int = 30) -> bytes | None:
        """The latest whole payload; None if nothing was written yet or no stable copy in ``tries``
        (a few ms at most: a sampler keeps its previous snapshot rather than wait on the worker)."""
        mm = self._mm
        for i in range(tries):
            seq = _SEQ.unpack_from(mm, 0)[0]
            length, crc = _BODY.unpack_from(mm, _SEQ.size)
            if seq % 2 == 0 and length <= self.capacity:
                data = mm[_HEADER:_HEADER + length]
                if _SEQ.unpack_from(mm, 0)[0] == seq and zlib.crc32(data) == crc:
                    return data if seq else None
            time.sleep(0 if i < 10 else 1e-4)
        return None

    def close(self) -> None:
        """Unmap and close the descriptor; safe to call twice."""
        if not self._mm.closed:
            self._mm.close()
            os.close(self.fd)


class SnapshotReader:
    """Like :class:`~.sources.activity.CachedActivity`, from the buffer: ``refresh()`` once per
    sample, then ``reader()`` is that snapshot; a failed read keeps the previous one."""

    def __init__(self, buffer: SnapshotBuffer):
        self._buffer, self._snap = buffer, IDLE
        self.refresh()

    def refresh(self) -> None:
        data = self._buffer.read()
        if data is not None:
            self._snap = decode_snapshot(data)

    def __call__(self) -> SharedActivity:
        return self._snap


class Sidecar:
    """The worker's handle on its sampling process (see the module docstring).

    ``settings`` are the worker's resolved :class:`~.config.Settings`; ``tags``
    the common tags without ``job``/``dag``. Raises ``OSError`` if it cannot start.
    """

    def __init__(self, settings, session: str, address: str, tags: dict, size: int = BUFFER_BYTES):
        self.buffer = SnapshotBuffer.create(size)
        self._last = None
        self._failed = False
        config = {"settings": dataclasses.asdict(settings), "session": session, "worker": address,
                  "pid": os.getpid(), "tags": tags, "fd": self.buffer.fd, "size": size}
        try:  # settings travel on stdin, never argv (credentials); the pipe's EOF ends the sidecar
            self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, pass_fds=(self.buffer.fd,))
        except BaseException:
            self.buffer.close()
            raise
        try:
            self.proc.stdin.write(json.dumps(config).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> bool:
        """Block until the sidecar samples (True), or exits or takes ``timeout`` s (False)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        self.proc.stdout.close()
        return line == b"ready\n"

    def poll(self) -> int | None:
        """The sidecar's exit code, or None while it runs."""
        return self.proc.poll()

    def publish(self, activity: Activity, scheduler_delay: float) -> None:
        """Write the snapshot if it changed; never raises (an error is logged once)."""
        if (activity, scheduler_delay) == self._last:
            return
        try:
            self.buffer.write(encode_snapshot(activity, scheduler_delay, self.buffer.capacity))
            self._last = (activity, scheduler_delay)
        except Exception as e:
            if not self._failed:
                self._failed = True
                logger.warning("influx-metrics: cannot publish the activity snapshot: %r (reported once)", e)

    def close(self, timeout: float = 5.0) -> int:
        """Close the pipe (the sidecar flushes and exits), wait ``timeout`` s, then terminate, then kill."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        for stop, wait in ((lambda: None, timeout), (self.proc.terminate, 2.0), (self.proc.kill, None)):
            stop()
            try:
                code = self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.buffer.close()
        return code




def _until_eof(fd: int, stop: threading.Event) -> None:
    """Set ``stop`` when the worker closes the pipe (or dies). Raw reads: no buffer lock at exit."""
    try:
        while os.read(fd, 65536):
            pass
    finally:
        stop.set()


def main(stdin=None) -> int:
    """The sidecar process: ``python -m dask_influx_metrics.worker.sidecar`` with its config on stdin."""
    import psutil

    from ..config import Settings
    from .build import build_sampler

    stdin = stdin or sys.stdin.buffer
    ready = os.fdopen(os.dup(1), "wb")  # "ready" goes to the worker; any other output to stderr
    os.dup2(2, 1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the worker decides
    config = json.loads(stdin.readline() or "null")
    if not config:
        return 2
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s - influx-metrics sidecar of {config['worker']}"
                        " - %(levelname)s - %(message)s")
    settings, pid = Settings.from_dict(config["settings"]), config["pid"]
    buffer = SnapshotBuffer(config["fd"], config["size"], writable=False)
    activity = SnapshotReader(buffer)
    sampler, (gpu, sink) = build_sampler(
        settings, config["session"], config["worker"], config["tags"], activity,
        clock_offset=lambda: activity().scheduler_delay, report=lambda what, message, **details: logger.warning(message),
        process=psutil.Process(pid),
    )
    threading.Thread(target=_until_eof, args=(stdin.fileno(), stop), name="eof", daemon=True).start()
    sampler.start()
    ready.write(b"ready\n")
    ready.close()
    while not stop.wait(0.25) and os.getppid() == pid:
        pass
    sampler.stop()
    sink.close()
    if gpu is not None:
        gpu.close()
    buffer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
