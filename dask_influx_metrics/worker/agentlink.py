"""A worker's link to its host's sampling agent: register, publish, wake, watch, leave.

On :class:`AgentLink` construction the worker, under the session folder's
``start.lock`` (:mod:`..link.runfolder`), writes its task snapshot and its
registration, and launches the agent if none holds ``agent.lock``
(``python -m dask_influx_metrics.agent``, in a session of its own so it outlives
this worker; the lock is taken here and handed over on an inherited
descriptor). The launch does not wait for the agent: :meth:`started` does (the
worker plugin calls it off the worker's start). The agent is forked by a short-lived
launcher (:data:`LAUNCH`) that exits at once, so it is never the worker's child:
nothing is left to reap when it outlives the worker. From then on:

* :attr:`publisher` publishes the worker's task starts and ends (event loop, just before
  the agent's next sample: :meth:`publish_from`);
* :meth:`wake` sends one datagram to the agent when a task starts on an idle worker;
* a watcher thread checks that the agent lives: woken the moment it exits (it waits on the agent's pidfd
  too), and looking for a hung one (the agent's relay worker when the agent's beat would be stale, the
  others every 5 s): a free ``agent.lock`` (the agent died) or, seen by the relay, a beat
  older than 3 polling intervals + 0.25 s (it hangs: it is killed) makes it start another, at most one
  per host (the lock again), and say so once per gap;
* the same thread, the only one the link runs, writes the points only the worker
  makes (custom metrics, the task stream) into its :attr:`outbox` for the agent to
  send (:meth:`every`);
* :meth:`leave` writes them one last time, removes the registration, wakes the
  agent and waits (bounded) until it has sampled this worker one last time, sent
  its outbox and flushed (it then removes the snapshot).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from ..config import AGENT_ENV
from ..flag import PollFlag
from ..link import runfolder
from ..link.outbox import BUDGET_BYTES as OUTBOX_BUDGET
from ..link.outbox import Outbox
from ..link.seqlock import SnapshotBuffer
from ..link.snapshot import BUFFER_BYTES, BeatReader, Publisher, write_delay
from ..notices import Once

logger = logging.getLogger(__name__)
START_TIMEOUT = 30.0  # s for an agent to start sampling (it imports this package and NVML)
WATCH_S = 0.15  # s: the shortest pause of the relay worker's watcher (dead or hung agent)
WATCH_MAX_S = 1.0  # s: its longest
MAX_RESTARTS, RESTART_WINDOW_S = 3, 30.0  # agents dying faster than this: give up (sample in-process)
BACKUP_S = 5.0  # how often the others look: a dead agent the relay missed (it left, hangs), whether they relay now
STALL_MARGIN = 0.25  # s: a beat 3 intervals + this old means a hung agent
HANG_SLACK_S = 0.25  # s past that a hung agent may go unseen, when a death wakes the watcher (fewer looks)
PUBLISH_LAG_S = 0.005  # s before the agent's sample that a worker writes its changes (at most interval / 10)
LAUNCHER_EXIT_S = 5.0  # s a leaving worker waits for a launcher that has not exited yet (it exits once it forked)
# The launcher: forks the agent and exits, so the kernel re-parents the agent (to init or a subreaper) and the
# worker reaps only the launcher, within milliseconds. The agent keeps the launcher's stdin, stdout and the
# agent.lock descriptor, and runs as `python -m dask_influx_metrics.agent` (what ps shows).
LAUNCH = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.execv(sys.executable, [sys.executable, '-m', 'dask_influx_metrics.agent'])\n"
)
_ids = itertools.count(1)
_in_use: set[str] = set()  # ids taken in this process (several workers in one process)


class AgentLink:
    """See the module docstring. ``config``: what the agent is started with (settings, session);
    ``info``: this worker's registration (address, tags, CUDA_VISIBLE_DEVICES, ...);
    ``snapshot``: its tasks now (the first snapshot); ``report(what, message, **details)``."""

    def __init__(self, config: dict, info: dict, snapshot, report):
        self.config, self.report = config, report
        settings = config["settings"]
        self.interval = settings["polling_interval"] / 1000.0
        self.folder = runfolder.session_folder(config["session"], settings.get("run_directory"))
        self.id = str(os.getpid())
        self._dir = os.path.join(self.folder, runfolder.WORKERS)
        self._launchers: list[subprocess.Popen] = []  # reaped as they exit (at once: see LAUNCH)
        self._ready = None  # the pipe the agent this worker launched says "ready" on, until started() reads it
        self._beat, self._beat_inode, self._beat_pid = None, None, None
        self._swap, self._retired = threading.Lock(), []  # beat readers replaced by a newer file's (_open_beat)
        self._exit_pid, self._exit_fd = None, None  # the agent whose exit the watcher waits for, and its pidfd
        self._closed = threading.Event()  # leaving: the watcher stops, started() and found() give up
        self._stopped, self._stop_w = os.pipe()  # readable once stop_waiting() was called (started() waits on it)
        self._left, self._held = False, False  # leave() ran; this worker holds agent.lock (the agent is gone)
        self._checked = None  # the beat's version when a task start last looked at it (see wake())
        self._ticks = (None, None)  # (the beat reader, the schedule it gave): see _defer()
        self._restarts: list[float] = []  # when this worker replaced an agent (monotonic)
        self.failed, self.gaps = None, 0  # why it gave up on the agent (it then samples in-process); agents replaced
        self._every, self._due = None, math.inf  # (seconds, fn) the watcher thread also runs; when next
        self._idle = None  # () -> whether fn has nothing to do (the watcher then does not wake for it)
        self._wake, self._parked = PollFlag(), False  # set on leave; by nudge() only while parked (idle)
        self._once = Once()
        with runfolder.locked(self.folder, runfolder.START_LOCK):
            # taken by another worker of this process, or by a namesake in another PID namespace
            while self.id in _in_use or os.path.exists(os.path.join(self._dir, f"{self.id}.json")):
                self.id = f"{os.getpid()}.{next(_ids)}"
            _in_use.add(self.id)
            self._snap = SnapshotBuffer.create(BUFFER_BYTES, path=os.path.join(self._dir, f"{self.id}.snap"))
            spill = runfolder.spill_folder(settings["spool_directory"], config["session"])
            budget = settings.get("outbox_budget", OUTBOX_BUDGET)
            # this worker's own points, for the agent to send
            self.outbox = Outbox(self._dir, self.id, budget=budget, spill=spill, report=report)
            # held for life: an agent that cannot see this pid (another PID namespace) tells dead from alive by it
            self._life = runfolder.try_lock(self._dir, runfolder.life_lock(self.id))
            self.publisher = Publisher(self._snap, self.acked, snapshot.nthreads, snapshot.running, snapshot.last_job)
            info = {**info, "pid": os.getpid(), "started": runfolder.started(), "spill": spill}
            runfolder.write_worker(self.folder, self.id, info)
            runfolder.check_room(self.folder, budget, spill, report)
            held = runfolder.try_lock(self.folder, runfolder.AGENT_LOCK)
            if held is not None:
                self._start(held)
        self._probe = os.open(os.path.join(self.folder, runfolder.AGENT_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._watcher = threading.Thread(target=self._watch, name="influx-metrics-worker", daemon=True)
        self._watcher.start()

    # --- the agent's beat ---------------------------------------------------------------
    def beat(self) -> dict | None:
        """The agent's latest beat (:class:`~..link.snapshot.BeatReader`); a stale one (a new agent writes a new
        file, which the watcher of a worker other than the relay follows only every :data:`BACKUP_S`) makes
        this worker look for a newer file first."""
        if self._beat is not None and time.monotonic() - self._beat.when() > 3 * self.interval + STALL_MARGIN:
            self._follow_beat()
        return self._read_beat()

    def _read_beat(self) -> dict | None:
        reader = self._beat or self._open_beat()  # (one read of the attribute: another thread may replace it)
        return reader() if reader is not None else None

    def _open_beat(self) -> BeatReader | None:
        """Read the beat file there now from now on. The reader it replaces stays open until :meth:`leave`: the
        watcher and the event loop both read the beat, and either may be reading that one now."""
        reader = BeatReader.open(os.path.join(self.folder, runfolder.BEAT), self.id)
        if reader is not None:
            with self._swap:
                self._retired.append(self._beat)
                self._beat, self._beat_inode = reader, reader.inode()
        return reader

    def _follow_beat(self) -> None:
        """A new agent writes a new beat file: read that one from now on."""
        try:
            inode = os.stat(os.path.join(self.folder, runfolder.BEAT)).st_ino
        except OSError:
            return
        if self._beat is not None and inode != self._beat_inode:
            self._open_beat()
        beat = self._read_beat()
        if beat and beat["pid"] != self._beat_pid:  # a new agent (one with no room writes its beat in place)
            self._ticks, self._beat_pid = (None, None), beat["pid"]

    def acked(self) -> int:
        return self._beat.acked() if self.beat() is not None else 0  # (a stale beat's successor followed)

    def sampled(self, timeout: float) -> dict | None:
        """:meth:`started`, then :meth:`found`: what the agent found of this worker once it sampled it."""
        self.started()
        return self.found(timeout)

    def found(self, timeout: float) -> dict | None:
        """What the agent found of this worker's GPUs (``{"gpu", "devices", "why"}``), waiting up to
        ``timeout`` s for its first sample of this worker; None if it has not sampled it by then."""
        deadline = time.monotonic() + timeout
        while True:
            beat = self.beat()
            if beat and self.id in beat.get("found", {}):
                return beat["found"][self.id]
            if beat and self.id in beat.get("foreign", {}):
                raise RuntimeError(beat["foreign"][self.id])
            if time.monotonic() > deadline:
                return None
            self.wake("folder")
            if self._closed.wait(0.01):  # leaving (stop_waiting): at once
                return None

    # --- starting and watching the agent --------------------------------------------------
    def _start(self, held: int) -> None:
        """Launch an agent, handing it ``held`` (our lock on ``agent.lock``); caller holds ``start.lock``.
        Returns at once: :meth:`started` waits until it samples."""
        try:
            launcher = subprocess.Popen(
                [sys.executable, "-S", "-c", LAUNCH],  # -S: no site-packages to look at, it only forks
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(held,),
                start_new_session=True,
                env={**os.environ, AGENT_ENV: "1"},  # its settings come resolved: it imports no Dask
            )
        finally:
            os.close(held)
        self._launchers.append(launcher)
        self._ready = launcher.stdout
        try:
            launcher.stdin.write(json.dumps({**self.config, "folder": self.folder}).encode() + b"\n")
        finally:
            launcher.stdin.close()

    def started(self, timeout: float = START_TIMEOUT) -> None:
        """Wait up to ``timeout`` s for the agent this worker launched to say it samples (and say so if it does
        not); returns at once when another worker launched it, and as soon as :meth:`stop_waiting` is called."""
        pipe, self._ready = self._ready, None
        if pipe is None:
            return
        poll = select.poll()  # (select.select fails on descriptors past 1023)
        poll.register(pipe, select.POLLIN)
        poll.register(self._stopped, select.POLLIN)
        with pipe:
            ready = [fd for fd, _ in poll.poll(timeout * 1000)]
            line = pipe.readline() if pipe.fileno() in ready else b""
        self._reap()
        if line != b"ready\n" and not self._closed.is_set():
            self.report(
                "agent",
                f"the sampling agent did not start within {timeout:.0f} s or exited first (its log, on this "
                "worker's stderr, says why); this host's samples are missing until it does",
            )
        self._follow_beat()

    def stop_waiting(self) -> None:
        """The worker is leaving: :meth:`started` and :meth:`found` return now, the watcher stops."""
        self._closed.set()
        self._wake.set()
        os.write(self._stop_w, b"x")

    def _reap(self, timeout: float = 0.0) -> None:
        """Wait up to ``timeout`` s for the launchers still running (each exits once it forked its agent)."""
        for launcher in self._launchers:
            try:
                launcher.wait(timeout)
            except subprocess.TimeoutExpired:
                if timeout:  # stuck before it forked: no agent will come of it
                    launcher.kill()
                    launcher.wait()
        self._launchers = [p for p in self._launchers if p.returncode is None]

    def every(self, seconds: float, fn, idle=None) -> None:
        """Run ``fn()`` every ``seconds`` on the watcher thread, and once more in :meth:`leave` (it writes the
        worker's own points into :attr:`outbox`: the agent sends them). While ``idle()`` says there is nothing
        to write, the thread does not wake for it; :meth:`nudge` says there is again."""
        self._every, self._due, self._idle = (seconds, fn), time.monotonic() + seconds, idle
        self._wake.set()  # the watcher's wait was timed without it

    def nudge(self) -> None:
        """:meth:`every`'s ``fn`` has work again (a task started on an idle worker): wakes the watcher if parked."""
        if self._parked and not self._wake.is_set():
            self._wake.set()

    def _next_due(self) -> float:
        if self._every is None or (self._idle is not None and self._idle()):
            return math.inf
        return self._due

    def _run_every(self) -> None:
        now = time.monotonic()
        if self._every is not None and now >= self._next_due():
            period = self._every[0]
            # drift-free; after a late run (or an idle while) the next is a period away, not due at once
            self._due = self._due + period if self._due + period > now else now + period
            self._every_once()

    def _every_once(self) -> None:
        fn = self._every[1]
        try:
            fn()
        except Exception as e:  # the worker's own points must never stop its watch of the agent, nor its leave
            if self._once("every"):
                logger.warning("influx-metrics: %r failed: %r (reported once)", fn, e, exc_info=e)

    def _watch(self) -> None:
        """One worker of the host (the agent's relay) looks for a dead or a hung agent when its beat would be
        stale (:meth:`_pause`); the others every :data:`BACKUP_S`, for a dead one (a free lock: one system call).
        Between looks, what :meth:`every` asked for."""
        relay, n, looked = False, 0, 0.0
        look = time.monotonic() + self._pause(relay, n)
        while True:
            if self._beat_pid != self._exit_pid:
                self._watch_exit(self._beat_pid)
            self._parked = True  # set before idle() is looked at: a nudge from then on wakes this wait
            self._parked = (due := self._next_due()) == math.inf and self._every is not None  # untimed for fn
            fds = () if self._exit_fd is None else (self._exit_fd,)
            exited = self._wake.wait(max(0.0, min(look, due) - time.monotonic()), fds)
            self._wake.clear()  # before fn runs: what comes while it runs wakes the next round
            if self._closed.is_set():
                return
            self._run_every()
            if exited:  # the agent exited: look now
                self._watch_exit(None)
            elif time.monotonic() < look:
                continue
            n += 1
            if self._launchers:
                self._reap()
            if not relay or time.monotonic() - looked >= BACKUP_S:
                looked = time.monotonic()
                self._follow_beat()
                beat = self.beat()
                relay = bool(beat) and beat.get("relay") == self.id
            # the relay: a beat within the last interval (one comes every interval + 0.125 s at most) says the
            # agent lived then: no lock to look at (a system call)
            overdue = exited or self._beat is None or time.monotonic() - self._beat.when() > self.interval
            if (not relay or overdue) and not self._free() and relay and self._killed_hung():
                deadline = time.monotonic() + 1.0
                while not self._free() and time.monotonic() < deadline:  # the kernel frees its lock
                    time.sleep(0.005)
            if self._held:
                self._held = False
                if self._closed.is_set():
                    fcntl.flock(self._probe, fcntl.LOCK_UN)
                    return
                self._replace()
            look = time.monotonic() + self._pause(relay, n)

    def _watch_exit(self, pid: int | None) -> None:
        """Have the watcher's wait end the moment agent ``pid`` exits (its pidfd, Linux 5.3+), so that a dead
        agent is replaced at once, with no look for it. Where its pid cannot be waited on (an older kernel, an
        agent in another PID namespace), the looks find a dead agent as they find a hung one. None: it exited."""
        if self._exit_fd is not None:
            os.close(self._exit_fd)
        self._exit_fd = None
        if pid is None:  # (its pidfd would stay readable)
            return
        self._exit_pid = pid
        try:
            self._exit_fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pass

    def _pause(self, relay: bool, n: int) -> float:
        """Seconds to the watcher's next look. The relay: until the agent's latest beat would be 3 intervals +
        :data:`STALL_MARGIN` old, or :data:`HANG_SLACK_S` later when the agent's exit wakes this thread (only a
        hung agent waits for a look: ~1.5 looks a second at 100 ms, not ~3), at least :data:`WATCH_S`. Others:
        :data:`BACKUP_S` (a look of an idle thread costs ~100-200 us of CPU), after a first second at WATCH_S."""
        if not relay:
            return WATCH_S if n < 1 / WATCH_S else BACKUP_S
        age = time.monotonic() - self._beat.when() if self._beat is not None else 0.0
        slack = HANG_SLACK_S if self._exit_fd is not None else 0.0
        return min(WATCH_MAX_S, max(WATCH_S, 3 * self.interval + STALL_MARGIN + slack - age))

    def _free(self) -> bool:
        """Whether ``agent.lock`` is free (no agent): then this worker holds it."""
        try:
            fcntl.flock(self._probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: an agent lives
            return False
        self._held = True
        return True

    def _killed_hung(self) -> bool:
        """Kill an agent whose beat is older than 3 intervals + :data:`STALL_MARGIN` (a stopped process
        ignores SIGTERM); whether one was."""
        limit = 3 * self.interval + STALL_MARGIN
        if self._beat is None or time.monotonic() - self._beat.when() <= limit:
            return False
        beat = self.beat()  # stale at a glance: read it properly before killing
        if beat is None or time.monotonic() - beat["time"] <= limit:
            return False
        try:
            os.kill(beat["pid"], signal.SIGKILL)
        except OSError:
            return False
        return True

    def _replace(self) -> None:
        """The agent is gone and this worker holds ``agent.lock``: start the next one (unless agents keep
        dying: :data:`MAX_RESTARTS` within :data:`RESTART_WINDOW_S`; then :attr:`failed` says why)."""
        beat = self.beat()
        old = beat.get("pid") if beat else None
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
        if len(self._restarts) > MAX_RESTARTS:
            fcntl.flock(self._probe, fcntl.LOCK_UN)
            self.failed = (
                f"the sampling agent stopped {len(self._restarts)} times within {RESTART_WINDOW_S:.0f} s "
                "(its log says why)"
            )
            self._closed.set()
            return
        with runfolder.locked(self.folder, runfolder.START_LOCK):
            if not os.path.exists(os.path.join(self._dir, f"{self.id}.json")):  # leaving
                fcntl.flock(self._probe, fcntl.LOCK_UN)
                return
            # the lock goes to the new agent with this descriptor's open file (closed here, never unlocked)
            try:
                self._start(self._probe)
            except OSError as e:  # cannot even run it: counted like an agent that died at once, none said started
                self.report("agent", f"cannot start the sampling agent ({type(e).__name__}: {e})")
                return
            finally:
                self._probe = os.open(os.path.join(self.folder, runfolder.AGENT_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        self.started()
        self.gaps += 1
        self.report(
            "agent",
            f"the sampling agent (pid {old}) stopped; another was started (samples of this "
            "host are missing for the gap)",
            pid=old,
        )

    # --- what the worker does ---------------------------------------------------------------
    def publish_from(self, loop) -> None:
        """Publish task starts and ends from the worker's event loop ``loop``: a change is written just before
        the agent's next sample (:data:`PUBLISH_LAG_S` before it, at most a tenth of the polling interval; its
        schedule is in the beat), with those that follow it: short tasks cost a write per interval, not one
        or two each. A wake writes at once. A sample sees this worker's tasks as they were that lag before
        it; one that started and ended in between is counted at the next."""
        self._loop = loop
        self.publisher.defer = self._defer

    def _defer(self, flush) -> None:
        reader = self._beat
        if self._ticks[0] is not reader:  # an agent's schedule is fixed: read once per agent (beat file)
            beat = reader() if reader is not None else None
            ticks = beat.get("ticks") if beat else None
            self._ticks = (reader if ticks else None, ticks)  # none yet: look again next time
        lag = min(PUBLISH_LAG_S, self.interval / 10)
        self._loop.call_later(write_delay(time.monotonic(), self._ticks[1], lag), flush)

    def wake(self, why: str = "task") -> None:
        """A task started on an idle worker (``why="task"``): the agent samples now unless its last sample
        saw tasks (then no datagram); one look at its beat and one datagram per agent sample at most. Arriving
        and leaving (``"folder"``) also make it look at the run folder."""
        if why == "task":
            beat = self._beat
            version = beat.buffer.version() if beat is not None else -1  # rewritten once per agent sample
            if version == self._checked:
                return  # decided for this sample already: woken, or it saw tasks here
            self._checked = version
            if beat is not None and not beat.saw_idle():
                return  # its latest sample saw tasks here: the next one shows this task
            self.publisher.flush()  # the task is in the snapshot the agent reads
        try:
            self._sock.sendto(f"{self.id} {why}".encode(), os.path.join(self.folder, runfolder.SOCKET))
        except OSError:  # no agent listening right now: the next tick sees the task anyway
            pass

    def leave(self, timeout: float | None = None) -> None:
        """Leave the session on this host: the agent samples this worker once more (tasks no sample
        saw) and flushes; waits up to ``timeout`` s (default 3 intervals + 2 s) for that. An agent that has
        not sampled this worker yet (it is still starting) is not waited for: it has nothing of it to send."""
        if self._left:
            return
        self._left = True
        self.stop_waiting()  # the watcher too, also while it waits for an agent it started
        self._watcher.join(WATCH_S * 4 + (self._every[0] if self._every else 0.0))
        if self._ready is not None:  # never waited for: the agent finds no worker and exits
            self._ready.close()
            self._ready = None
        self._reap(LAUNCHER_EXIT_S)
        if self._every is not None:  # the worker's last points, before the agent's last look
            self._every_once()
        self.outbox.close()
        self.publisher.publish()
        beat = self.beat()
        known = bool(beat) and self.id in beat.get("found", {})
        try:
            os.unlink(os.path.join(self._dir, f"{self.id}.json"))
        except FileNotFoundError:
            pass
        snap = os.path.join(self._dir, f"{self.id}.snap")
        deadline = time.monotonic() + (3 * self.interval + 2.0 if timeout is None else timeout)
        woke = -math.inf
        while known and os.path.exists(snap) and (now := time.monotonic()) < deadline:
            if now - woke >= 0.01:  # the agent answers the first at once; again in case it missed it
                self.wake("folder")
                woke = now
            time.sleep(0.002)
        for fd_owner in (self._snap, *(r.buffer for r in (self._beat, *self._retired) if r is not None)):
            if fd_owner is not None:
                fd_owner.close()
        for path in (snap, os.path.join(self._dir, runfolder.life_lock(self.id))):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if self._life is not None:
            os.close(self._life)
        for fd in (self._probe, self._stopped, self._stop_w):
            os.close(fd)
        if self._exit_fd is not None and not self._watcher.is_alive():  # (a watcher still replacing may use it)
            os.close(self._exit_fd)
        self._sock.close()
        _in_use.discard(self.id)

    def counters(self) -> list[dict]:
        """The agent's sink counters (and those of agents that died) as of its latest sample, and this worker's
        outbox's (points written, spilled to disk, lost for want of room)."""
        beat = self.beat()
        return (list(beat.get("counters", [])) if beat else []) + self.outbox.counters()
