"""The sampling agent: one process per host, OS user and session (``python -m dask_influx_metrics.agent``).

Started by the first worker of the session on the host that finds none
(:mod:`..worker.agentlink`; ``start.lock`` decides, so two starting at once
leave exactly one), with its settings as one JSON line on stdin (never argv:
credentials) and ``agent.lock`` already locked on an inherited descriptor, so
no moment passes without a holder. Each tick it lists the workers registered in
the run folder (:mod:`.workers`), takes their task snapshots, writes its beat
(:mod:`..link.snapshot`: the snapshots it used, its sink's counters, what it
reports, and every half second each worker's latest figures for the dashboard,
:mod:`..sampling.live`), samples every GPU the workers use once, the host once and each worker
process (:mod:`.collect`), and sends to its one sink (UDP to the node's
Telegraf, HTTP, spool: ``sink: auto`` decided from its settings), with the points
the workers left in their outboxes (:mod:`..link.outbox`: custom metrics, task stream):
the host's one sender. A datagram on
``agent.sock`` naming a worker whose last sample saw it idle asks for a sample
at once (a short graph still gets a busy sample).

A worker leaving removes its ``.json``; the agent samples its last snapshot,
flushes, then removes its ``.snap``, which the worker waits for. With no worker
left (also when they all left before its first look, or on SIGTERM) it takes ``start.lock``,
checks again, flushes, closes its sink and removes the session's run folder.
A killed agent frees ``agent.lock`` at once; a worker then starts another,
which keeps its predecessor's counters (``Monitor.delivery()``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import NamedTuple

from ..config import Settings, public
from ..flag import Flag
from ..link import runfolder
from ..link.seqlock import SnapshotBuffer
from ..link.snapshot import BEAT_BYTES, BeatReader, write_beat
from ..names import GpuState, agent_role
from ..notices import Reporter
from ..sampling.host import HostSampling
from ..sampling.sampler import Sample
from ..sampling.view import WorkerView
from ..schema import GPU, SESSION
from . import prometheus
from .workers import FolderWorkers

logger = logging.getLogger(__name__)
EXIT_CHECK_S = 5.0  # how often the agent looks whether its run folder is gone (its sampler says when no worker is left)
KEEP_REPORTS = 32
COUNTERS_S = 1.0  # the sink's counters go into the beat this often
DRAIN_PAUSE_S = 0.05  # between the parts of a backlog the agent sends before it exits
# A beat at least every interval + this: workers take one older than 3 intervals + 0.25 s for a hung agent,
# and a live agent's beat is at most this + 2 intervals old. Every 3rd sample at 100 ms (was each one).
BEAT_SLACK_S = 0.125
LEAVE_DRAIN_S = 2.0  # at most this long to post an HTTP sink's queue when a worker leaves


class BeatState(NamedTuple):
    """What the beat's document says, beside liveness: encoded again only when it changes."""

    counters: list  # the sink's, once a second
    reported: int  # reports made so far
    found: int  # workers whose GPUs were looked at
    foreign: int  # workers this agent cannot sample
    origin: float | None  # the sampler's first tick
    figures: int  # the live figures' version
    relay: str | None  # the worker that passes the agent's reports on: the first to arrive


class Agent:
    """Samples the workers registered in ``folder`` (see the module docstring)."""

    def __init__(self, settings: Settings, session: str, folder: str):
        self.settings, self.session, self.folder = settings, session, folder
        self._public = json.loads(json.dumps(public(settings)))  # as workers register theirs
        self.reports: list = []  # [number, event] of the latest reports, relayed by a worker
        self._reported = 0
        self.report = Reporter(self._keep)
        self.previous = self._predecessor()  # counters of an agent that died before this one
        # the run folder's filesystem too (/dev/shm: the snapshots, outboxes), beside the workers' own
        self.core = HostSampling(
            settings,
            {"worker": agent_role(), SESSION: session},
            self.report.once,
            self.collect,
            name="influx-metrics-agent",
            paths=(folder,),
            serve=True,
            sample_on_wake=True,  # on the wake listener's thread: the sampler thread sleeps between ticks
        )
        labels = {"host": socket.gethostname(), "session": session}
        self.endpoint = prometheus.serve(settings, self.core.accounting, labels, self.report.once)
        self.spill = runfolder.spill_folder(settings.spool_directory, session)
        self.workers = FolderWorkers(folder, self._view, self.spill)
        self.found: dict[str, dict] = {}  # worker id -> its GPU state, devices and why
        self.beat = self._new_beat(os.path.join(folder, runfolder.BEAT))
        self._left: list[WorkerView] = []
        self._woken = False  # a worker woke the agent since the last sample
        self._lock = threading.Lock()  # the sampler thread and the main thread both write the beat
        self._counted, self._counters = -COUNTERS_S, []
        self._said: tuple = (None, None)  # (BeatState, the fast part) of the last beat written
        self._doc = self._head = b"{}"
        self._payload = b"{}\n{}"  # the last beat's JSON: _head, then _doc
        self._beat_at = 0.0
        self._pid = os.getpid()
        self._said_shared: set = set()  # the shared GPUs reported
        self.alone = Flag()  # set by the sampler when no worker is left: the main thread looks whether to exit

    def _keep(self, event: dict) -> None:
        self._reported += 1
        self.reports = (self.reports + [[self._reported, event]])[-KEEP_REPORTS:]

    def _predecessor(self) -> list:
        """The counters of an agent of this session that died (the worker that replaced it said so)."""
        try:
            reader = BeatReader(SnapshotBuffer.open(os.path.join(self.folder, runfolder.BEAT), BEAT_BYTES), "")
        except (OSError, ValueError):
            return []
        beat = reader()
        reader.buffer.close()
        if not beat or beat.get("pid") == os.getpid():
            return []
        return [
            {**c, "agent": beat.get("pid"), "dead": True} for c in beat.get("counters", []) if not c.get("dead")
        ] + [c for c in beat.get("counters", []) if c.get("dead")]

    def _new_beat(self, path: str) -> SnapshotBuffer:
        """The beat file, reserved whole; on a file system with no room for it, the dead predecessor's,
        written in place (its pages are reserved): an agent never maps a page that could fault."""
        try:
            return SnapshotBuffer.create(BEAT_BYTES, path=path)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not os.path.exists(path):
                raise
            self.report.once(
                "run-folder",
                f"no room for a new beat in {self.folder} ({e.strerror}): this agent writes its predecessor's in place",
            )
            fd = os.open(path, os.O_RDWR)
            if os.fstat(fd).st_blocks * 512 < BEAT_BYTES:  # not reserved whole: never mapped for writing
                os.close(fd)
                raise
            return SnapshotBuffer(fd, BEAT_BYTES, writable=True)

    def _view(self, wid: str, info: dict, snapshot) -> WorkerView:
        view = WorkerView(wid, info, snapshot, self.settings.fields)
        differ = sorted(k for k, v in (info.get("settings") or {}).items() if self._public.get(k, v) != v)
        if differ:
            self.report.once(
                "agent",
                f"worker {view.address} resolved other settings than this host's agent "
                f"runs with ({differ}); the agent samples every worker of the host with its own "
                "(those of the worker that started it): configure the host's workers alike",
                key=("settings", tuple(differ)),
            )
        self.found[wid], state = self.core.found(view)
        if state not in (GpuState.NVML, GpuState.SIMULATED) and any(m == GPU for m, _ in self.settings.fields):
            self.report.once(
                "gpu-source",
                f"GPU metrics were asked for, but this host's workers write no GPU samples: {state.value} "
                f"({self.found[wid]['why']})",
                key=("gpu", state, self.found[wid]["why"]),
                state=state.value,
            )
        return view

    def _sent(self, taken: int) -> None:
        """A sample is out (:class:`~..sinks.sender.Sender`): the outboxes note how far the sink took their
        lines (what it could not take stays there for the next sample); the leaving workers let go."""
        self.workers.sent(taken)
        if self._left:
            self._let_go()
        if not self.workers.views:  # idle_for_good(), the leaving ones let go
            self.alone.set()

    def _let_go(self) -> None:
        """The leaving workers' last sample is out: flushed (in InfluxDB when their teardown returns), then
        their snapshots removed, which each waits for (in the same round: a worker's close is not held up
        until the next tick)."""
        self.core.sink.flush(drain=LEAVE_DRAIN_S)
        for view in self._left:
            self.workers.forget(view.id)
            self.found.pop(view.id, None)
            view.close()
        self._left = []

    def collect(self, now_ns: int) -> Sample:
        """One sample (the sampler's ``collect``; see the module docstring): its points and the workers'
        outboxes, which go out with them."""
        woken, self._woken = self._woken, False
        self._left = self.workers.refresh(changed=woken)
        views = self.workers.live() + self._left
        for w in views:
            w.snapshot.refresh()
        self.write_beat(views)
        points = self.core.sample(views, now_ns, final=bool(self._left))
        shared = self.core.collector.shared
        if shared and not self._said_shared.issuperset(shared):  # the message made once, when it is reported
            self._report_shared(shared)
        return Sample(points, self.workers.outgoing(), self._sent)

    def _report_shared(self, shared: dict) -> None:
        for uuid, users in shared.items():
            if uuid in self._said_shared:
                continue
            self._said_shared.add(uuid)
            addresses = [w.address for w in users]
            self.report.once(
                "shared-gpu",
                f"GPU {uuid} is used by {len(users)} workers of this host ({addresses}); "
                "each worker's rows carry its readings with that worker's own jobs (and, once a second, "
                "the worker's share of its kernel time); GPU-hours count it once",
                key=("shared-gpu", uuid),
                uuid=uuid,
                workers=addresses,
                host=socket.gethostname(),
            )

    def write_beat(self, views: list | None = None) -> None:
        """Liveness every sample; the rest encoded again only when it changed (counters: once a second).
        ``views``: the workers of this sample (default: those registered and those leaving)."""
        if views is None:
            views = self.workers.live() + self._left
        sampler, figures, now = self.core.sampler, self.core.figures, time.monotonic()
        if now - self._counted >= COUNTERS_S:
            self._counted = now
            self._counters = [{**c, "agent": self._pid} for c in self.core.sink.counters()]
        state = BeatState(
            self._counters,
            self._reported,
            len(self.found),
            len(self.workers.foreign),
            sampler.origin,
            figures.version,
            next(iter(self.workers.views), None),
        )
        acked, idle = {}, []  # idle: their next task start is worth a wake
        for w in views:
            acked[w.id] = w.snapshot.acked
            if not w.snapshot().running:
                idle.append(w.id)
        fast = (acked, idle)  # changes every sample while tasks run: a line of its own, cheap to decode
        new_state, new_fast = state != self._said[0], fast != self._said[1]
        if not (new_state or new_fast) and now - self._beat_at < sampler.interval + BEAT_SLACK_S:
            return  # nothing new to say, and the last beat is recent enough for the workers' watch
        self._beat_at = now
        if new_state:
            self._doc = json.dumps(
                {
                    "relay": state.relay,
                    "ticks": [sampler.origin, sampler.interval] if sampler.origin else None,
                    "found": self.found,
                    "foreign": self.workers.foreign,
                    "counters": self._counters + self.previous,
                    "reports": self.reports,
                    "live": figures.entries,
                    "acct": figures.accounting,
                },
                separators=(",", ":"),
            ).encode()
        if new_fast:
            self._head = json.dumps({"acked": acked, "idle": idle}, separators=(",", ":")).encode()
        if new_state or new_fast:
            self._said, self._payload = (state, fast), self._head + b"\n" + self._doc
        with self._lock:
            write_beat(self.beat, self._pid, sampler.samples, sampler.extra, self._payload)

    def wake(self, message: str) -> None:
        """``"<worker id> task"``: a task started on that worker: sample now if its last sample saw it
        idle. ``"<worker id> folder"``: it arrives or leaves: look at the run folder at the next sample."""
        worker_id, _, why = message.partition(" ")
        if why != "task" or worker_id not in self.workers.views:
            self._woken = True
        view = self.workers.views.get(worker_id)
        if view is None or not view.snapshot().executing:
            self.core.sampler.wake(urgent=why != "task")  # arriving or leaving: the worker waits for this sample

    def idle_for_good(self) -> bool:
        """Whether the session may be over here: no worker left to sample. A worker always registers before it
        launches an agent, so none at all means they left (also before this agent's first look); the caller
        checks the run folder again under ``start.lock``."""
        return not (self.workers.views or self._left)

    def close(self, remove: bool) -> None:
        """Last sample's lines out, sink closed; the run folder removed when ``remove``."""
        self.core.stop()
        if self.endpoint is not None:
            self.endpoint.close()
        while True:  # what the outboxes still hold (a backlog in parts, paced)
            outgoing = self.workers.outgoing()
            taken = self.core.sender.send([], outgoing)
            self.workers.sent(taken)
            if not self.workers.behind or taken < len(outgoing):  # done, or the sink takes no more: left there
                break
            time.sleep(DRAIN_PAUSE_S)
        self.core.close()
        left = self.workers.behind
        self.workers.close()
        self.write_beat()
        self.beat.close()
        if remove and left:  # the only copy of those points: the next agent of this host sends them
            logger.warning("the workers' outboxes in %s hold points the sink did not take: left there", self.folder)
        elif remove:
            runfolder.remove_session(self.folder)
            for folder in (self.spill, os.path.dirname(self.spill)):  # emptied by then (or others' files: kept)
                try:
                    os.rmdir(folder)
                except OSError:
                    pass


def _listen(sock: socket.socket, agent: Agent) -> None:
    while True:
        try:
            data = sock.recv(256)
        except OSError:  # closed at exit
            return
        agent.wake(data.decode(errors="replace"))


def main(stdin: int = 0) -> int:
    """The agent process, its config as one JSON line on ``stdin``; "ready" on stdout once sampling."""
    ready = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed goes to the log
    stopping = []  # SIGTERM came
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the workers decide
    with os.fdopen(os.dup(stdin), "rb") as f:
        config = json.loads(f.readline() or b"null")
    if not config:
        return 2
    logging.raiseExceptions = False  # a log whose reader is gone must not stop sampling
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s - influx-metrics agent {os.getpid()} - %(levelname)s - %(message)s"
    )
    folder = config["folder"]
    agent = Agent(Settings.from_dict(config["settings"]), config["session"], folder)
    look = agent.alone  # the main thread's wake: no worker left, SIGTERM, or EXIT_CHECK_S passed
    signal.signal(signal.SIGTERM, lambda *_: (stopping.append(True), look.set()))
    path = os.path.join(folder, runfolder.SOCKET)
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    os.chmod(path, 0o600)  # bind() made it with the umask's mode: only this user's workers write to it
    threading.Thread(target=_listen, args=(sock, agent), name="wake", daemon=True).start()
    agent.write_beat()
    agent.core.sampler.start()
    try:
        with ready:
            ready.write(b"ready\n")
    except BrokenPipeError:  # the worker that launched it left before it was ready: nobody to tell
        pass
    rescue = os.path.join(folder, runfolder.WORKERS)  # their outboxes: sent by this agent (FolderWorkers)
    stale_sessions = runfolder.remove_stale(os.path.dirname(folder), config["session"], rescue, agent.spill)
    for stale in stale_sessions:
        logger.info("removed the run folder of a session whose processes are gone: %s", stale)
    remove = False
    while not stopping:
        look.wait(EXIT_CHECK_S)
        look.clear()
        if stopping or not os.path.isdir(folder):
            break
        if agent.idle_for_good():
            with runfolder.locked(folder, runfolder.START_LOCK):
                if not runfolder.worker_files(folder):  # nobody arrived meanwhile
                    remove = True
                    agent.close(remove=True)
                    break
    if not remove:
        agent.close(remove=False)
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
