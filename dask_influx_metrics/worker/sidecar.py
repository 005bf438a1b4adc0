"""Isolated sampling (``influx-metrics.sampler.isolate: true``, the default): a sidecar process per worker.

Inside the worker, every psutil (``/proc``) and NVML (ctypes) call releases the
GIL and must win it back from the task threads, and so must the sampling thread
each time it wakes up, up to a switch interval (5 ms) each time, so samples slip
while tasks run pure Python. With ``isolate`` the worker plugin starts this
module as a child process (``python -m dask_influx_metrics.worker.sidecar``, not
``multiprocessing``: Dask worker processes are daemonic) that runs the
:class:`~.sampler.Sampler` with the GPU source, :class:`~.sources.host.HostSource`
(reading the *worker's* pid) and the task fields, and owns the worker's sink. It
imports neither Dask's scheduler side nor ``distributed`` (only ``dask.config``).

The worker only keeps its task registry and publishes it into shared memory
when a task starts or ends (:class:`~.shared.Publisher`; bytes held and the
clock offset once a second); the sidecar never calls into the worker. The other
way, the sidecar writes a heartbeat before each sample: its counts, the snapshot
it sampled (so the worker prunes the ended tasks it carries) and its sink's
delivery counters (``Monitor.delivery()``); see :mod:`.shared`.

Lifetime: the sidecar reads its settings as one JSON line on stdin; after that,
each byte on stdin is a *wake*: the worker writes one (non-blocking, the GIL
held) when a task starts on an idle worker and the sidecar has sampled since
its last one, and the sidecar takes an extra sample at once if its last sample
saw the worker idle (:meth:`~.sampler.Sampler.wake`: a graph shorter than the
interval still shows up). It samples until stdin reaches EOF (the plugin closes
it on teardown, after its last publish, or the worker died), its parent
changes, or SIGTERM; then it takes a last sample if the snapshot carries tasks
no sample has seen, flushes its sink and exits. The plugin waits for it
(bounded, then ``terminate``/``kill``), and if it cannot start or dies, reports
once and samples in-process instead. One whose sample count has not moved for 3
polling intervals + 0.5 s (the plugin looks once a second) is hung, e.g.
stopped: it is killed and treated as dead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time

from . import heldcalls
from .clock import SteadyOffset
from .shared import BEAT_BYTES, BUFFER_BYTES, Publisher, SnapshotBuffer, SnapshotReader, read_beat

__all__ = ["Sidecar", "SnapshotBuffer", "main"]  # SnapshotBuffer: also gpushare's (from here, as before)

logger = logging.getLogger(__name__)


class Sidecar:
    """The worker's handle on its sampling process (see the module docstring).

    ``settings`` are the worker's resolved :class:`~.config.Settings`; ``tags``
    the common tags without ``job``/``dag``; ``activity`` the worker's tasks now
    (an :class:`~.sources.activity.Activity`: the first snapshot). Feed
    :attr:`publisher` from then on. Raises ``OSError`` if it cannot start.
    """

    def __init__(self, settings, session: str, address: str, tags: dict, activity, size: int = BUFFER_BYTES):
        self.buffer = SnapshotBuffer.create(size)
        self.beat = SnapshotBuffer.create(BEAT_BYTES)
        self.publisher = Publisher(self.buffer, self.beat, activity.nthreads, activity.running, activity.last_job)
        self._samples, self._moved = None, time.monotonic()
        self._woken = -1  # the sample count when the last wake was sent
        config = {"settings": dataclasses.asdict(settings), "session": session, "worker": address,
                  "pid": os.getpid(), "tags": tags, "fd": self.buffer.fd, "size": size, "beat": self.beat.fd}
        try:  # settings travel on stdin, never argv (credentials); then wakes; its EOF ends the sidecar
            self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, pass_fds=(self.buffer.fd, self.beat.fd))
        except BaseException:
            self.buffer.close()
            self.beat.close()
            raise
        try:
            self.proc.stdin.write(json.dumps(config).encode() + b"\n")
            self.proc.stdin.flush()
            os.set_blocking(self.proc.stdin.fileno(), False)  # a wake never waits
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

    def stats(self) -> dict:
        """The sidecar's ``samples`` and ``extra`` (wake) samples so far, from its heartbeat."""
        beat = read_beat(self.beat)
        return {"samples": beat.samples, "extra": beat.extra} if beat else {"samples": 0, "extra": 0}

    def counters(self) -> list[dict]:
        """Its sink's delivery counters as of its latest sample (:func:`.sinks.counters`), or []."""
        beat = read_beat(self.beat)
        try:
            return json.loads(beat.counters) if beat else []
        except ValueError:
            return []

    def stalled_for(self) -> float:
        """Seconds since the sidecar's latest sample (its heartbeat; since it started before one)."""
        beat = read_beat(self.beat)
        if beat is not None and beat.samples != self._samples:
            self._samples, self._moved = beat.samples, beat.time
        return time.monotonic() - self._moved

    def wake(self) -> None:
        """A task started on an idle worker: one byte down the pipe, unless the sidecar has not
        sampled since the last one (it decides: an extra sample if its last one saw no task)."""
        beat = self.publisher.beat()
        samples = beat.samples if beat else 0
        if samples == self._woken:
            return
        self._woken = samples
        try:
            heldcalls.write(self.proc.stdin.fileno(), b"!")
        except (OSError, ValueError):  # full (it has wakes to read), closed, or the sidecar is gone
            pass

    def close(self, timeout: float = 5.0) -> int:
        """Close the pipe (the sidecar flushes and exits), wait ``timeout`` s, then terminate, then kill.

        Blocks up to ``timeout`` + 2 s: call it off the event loop."""
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
        self.beat.close()
        return code


def _config(fd: int) -> tuple[dict | None, bytes]:
    """The config line from the pipe, and what followed it (wakes); raw reads, nothing buffered."""
    data = b""
    while b"\n" not in data:
        more = os.read(fd, 65536)
        if not more:
            return None, b""
        data += more
    line, _, rest = data.partition(b"\n")
    return json.loads(line or b"null"), rest


def _listen(fd: int, stop: threading.Event, wake) -> None:
    """Each read from the worker's pipe is a wake; EOF (closed, or the worker died) sets ``stop``."""
    try:
        while os.read(fd, 4096):
            wake()
    finally:
        stop.set()


def main(stdin: int = 0) -> int:
    """The sidecar process: ``python -m dask_influx_metrics.worker.sidecar`` with its config on stdin."""
    import psutil

    from ..config import Settings
    from .build import build_sampler
    from ..sinks import counters

    ready = os.fdopen(os.dup(1), "wb")  # "ready" goes to the worker; any other output to stderr
    os.dup2(2, 1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the worker decides
    config, woken = _config(stdin)
    if not config:
        return 2
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s - influx-metrics sidecar of {config['worker']}"
                        " - %(levelname)s - %(message)s")
    settings, pid = Settings.from_dict(config["settings"]), config["pid"]
    buffer = SnapshotBuffer(config["fd"], config["size"], writable=False)
    beat = SnapshotBuffer(config["beat"], BEAT_BYTES, writable=True)
    activity = SnapshotReader(buffer, beat)
    sampler, (gpu, sink) = build_sampler(
        settings, config["session"], config["worker"], config["tags"], activity,
        clock_offset=SteadyOffset(lambda: activity().scheduler_delay), report=lambda what, message, **details: logger.warning(message),
        process=psutil.Process(pid),
    )
    activity.sampler = sampler

    def wake() -> None:
        if not activity().executing:  # as in-process: not between back-to-back tasks
            sampler.wake()

    threading.Thread(target=_listen, args=(stdin, stop, wake), name="wake", daemon=True).start()
    sampler.start()
    if woken:
        wake()
    ready.write(b"ready\n")
    ready.close()
    while not stop.wait(0.25) and os.getppid() == pid:
        activity.set_counters(json.dumps(counters(sink)).encode())
    # the worker published before closing the pipe: tasks no sample has seen get one more
    sampler.stop(final_sample=os.getppid() == pid and activity.unsampled())
    sink.close()
    if gpu is not None:
        gpu.close()
    beat.close()
    buffer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
