"""The agent's view of the run folder's workers (``agent/workers.py``): outboxes looked at only when written,
and what a dead worker left sent whatever it counted."""

import os
import subprocess
import sys

from dask_influx_metrics.agent import workers
from dask_influx_metrics.agent.workers import FolderWorkers
from dask_influx_metrics.link import runfolder
from dask_influx_metrics.link.outbox import Outbox
from dask_influx_metrics.link.seqlock import SnapshotBuffer
from dask_influx_metrics.link.snapshot import BUFFER_BYTES


class View:
    def __init__(self, wid, info, snapshot):
        self.id, self.pid, self.address, self.snapshot = wid, info["pid"], info["address"], snapshot

    def close(self):
        self.snapshot.close()


def register(folder, wid, pid):
    """A worker's files as :class:`..worker.agentlink.AgentLink` makes them: snapshot, outbox, registration."""
    d = os.path.join(folder, runfolder.WORKERS)
    os.makedirs(d, exist_ok=True)
    snap = SnapshotBuffer.create(BUFFER_BYTES, path=os.path.join(d, f"{wid}.snap"))
    out = Outbox(d, wid)
    runfolder.write_worker(folder, wid, {"address": f"tcp://{wid}", "pid": pid, "tags": {}})
    return snap, out


def test_a_dead_workers_lines_are_sent_though_it_died_before_counting_them(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "LIVENESS_S", 0.0)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        snap, out = register(str(tmp_path), "w1", proc.pid)
        folder = FolderWorkers(str(tmp_path), View)
        folder.refresh()
        assert list(folder.views) == ["w1"]
        out.send([b"m v=1i 1"])
        assert folder.outgoing() == [b"m v=1i 1"]
        folder.sent()
        assert folder.outgoing() == [] and folder._given == [], "nothing written since: nothing looked at or noted"
        with open(tmp_path / runfolder.WORKERS / "w1.out-0", "ab") as f:  # written; killed before its count
            f.write(b"m v=2i 2\n")
        assert folder.outgoing() == [], "a live worker counts what it writes"
        proc.kill()
        proc.wait()
        folder.refresh()
        assert folder.views == {}, "seen dead"
        assert folder.outgoing() == [b"m v=2i 2"], "its files read whatever it counted"
        folder.sent()
        assert not [n for n in os.listdir(tmp_path / runfolder.WORKERS) if n.startswith("w1.")], "then removed"
        snap.close()
        out.close()
    finally:
        proc.kill()
        proc.wait()
