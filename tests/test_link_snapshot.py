"""The worker <-> agent shared buffers: the seqlock buffer, the task snapshot (executing and recent
tasks) with its publisher and reader, and the agent's JSON beat."""

import json
import subprocess
import sys
import threading
import time

import pytest
from polling import wait_until

from dask_influx_metrics.link.seqlock import SnapshotBuffer
from dask_influx_metrics.link.snapshot import (
    BEAT_BYTES,
    BeatReader,
    Publisher,
    SnapshotReader,
    decode_snapshot,
    encode_snapshot,
    entry,
    write_beat,
)
from dask_influx_metrics.sampling.sources.tasks import key_json


class Pair:
    """A worker's publisher and the agent's reader of its snapshot (nthreads 4), over fresh buffers.

    :meth:`sample` does what the agent does for this worker at each sample: take the snapshot, then
    write its beat acknowledging it."""

    def __init__(self):
        self.buf, self.beat = SnapshotBuffer.create(1 << 16), SnapshotBuffer.create(BEAT_BYTES)
        self.beat_reader = BeatReader(self.beat, "w1")
        self.pub = Publisher(self.buf, self.beat_reader.acked, nthreads=4)
        self.reader = SnapshotReader(self.buf)
        self.samples = 0

    def sample(self) -> None:
        self.reader.refresh()
        self.samples += 1
        write_beat(
            self.beat, 1, self.samples, 0, doc({"acked": {"w1": self.reader.acked}, "counters": [], "reports": []})
        )


def doc(rest: dict) -> bytes:
    """The JSON part of a beat, as the agent encodes it."""
    return json.dumps(rest, separators=(",", ":")).encode()


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.buf.close()
    p.beat.close()


# --- the snapshot -------------------------------------------------------------------------
def test_snapshot_round_trip_keeps_keys_counts_tags_bytes_and_clock_offset(pair):
    pub, reader = pair.pub, pair.reader
    reader.refresh()
    assert reader().executing == 0  # nothing written yet: idle
    keys = [("x", 0, ("nested", 1.5)), "plain ünï \"q\"", ("b", 2)]
    for key, (job, dag) in zip(keys, [(1, 3), (2, 5), (0, 0)]):
        pub.started(key, job, dag)
    pub.update(managed_bytes=123, delay=-0.25)
    reader.refresh()
    snap = reader()
    assert snap.running == tuple((k, j, d) for k, (j, d) in zip(keys, [(1, 3), (2, 5), (0, 0)]))
    assert (snap.executing, snap.job_tag, snap.dag_tag, snap.last_job) == (3, "1,2", "3,5", 2)
    assert (snap.nthreads, snap.managed_bytes, snap.scheduler_delay) == (4, 123, -0.25)
    assert key_json(k for k, _, _ in snap.running) == key_json(keys)


def test_a_snapshot_too_big_for_the_buffer_drops_keys_with_exact_counts_and_tags():
    running = [entry(f"task-{'x' * 50}-{i}", 1 + i % 3, 10 + i % 7, i) for i in range(100)]
    data = encode_snapshot(100, 8, 5, 3, 0.0, running, [], limit=4096)
    seq, snap, recent = decode_snapshot(data)
    assert len(data) <= 4096 and {k for k, _, _ in snap.running} == {None}
    assert (snap.executing, snap.job_tag, snap.dag_tag) == (100, "1,2,3", "10,11,12,13,14,15,16")
    recent = [entry(f"r{i}", 1, 1, i) for i in range(2000)]  # then the oldest ended tasks go
    seq, snap, kept = decode_snapshot(encode_snapshot(7, 8, 5, 3, 0.0, [], recent, limit=4096))
    assert 0 < len(kept) < 2000 and kept[-1][3] == 1999
    with pytest.raises(ValueError):
        encode_snapshot(1, 8, 5, 3, 0.0, running, [], limit=500)


def test_a_task_that_started_and_ended_between_two_samples_is_counted_at_the_next_one_only(pair):
    pub, reader = pair.pub, pair.reader
    pub.started("long", 1, 1)
    pair.sample()
    pub.started("brief", 2, 7)
    pub.ended("brief")
    pub.started("seen", 2, 8)
    pair.sample()
    assert [k for k, _, _ in reader().running] == ["long", "seen", "brief"]
    assert (reader().executing, reader().job_tag, reader().dag_tag) == (3, "1,2", "1,7,8")
    pub.ended("seen")  # a sample saw it running: not carried
    assert not pub.unsampled()
    pair.sample()
    assert (reader().executing, reader().dag_tag) == (1, "1")
    pub.started("last", 3, 9)
    pub.ended("last")
    assert pub.unsampled()  # a last sample when the worker leaves would show it
    pair.sample()
    assert reader().dag_tag == "1,9" and not pub.unsampled()


def test_the_publisher_prunes_what_the_agent_acknowledged_and_folds_beyond_keep(pair):
    pub, reader = pair.pub, pair.reader
    for i in range(3):
        pub.started(i, 1, 1)
        pub.ended(i)
    assert len(pub._recent) == 3
    pair.sample()
    assert BeatReader(pair.beat, "w1").acked() == pub.seq == pub.acked()
    assert len(pub._recent) == 0  # pruned: the agent sampled them
    pub._keep = 5
    for i in range(10, 20):
        pub.started(i, 1, 1 + i % 2)
        pub.ended(i)
    assert len(pub._recent) <= 5
    pair.sample()
    keys = [k for k, _, _ in reader().running]
    assert keys[-3:] == [17, 18, 19] and None in keys  # the latest with keys, older ones folded
    assert reader().dag_tag == "1,2"  # tags exact


# --- the beat -------------------------------------------------------------------------------
def test_deferred_publishing_writes_the_changes_since_the_last_write_once(pair):
    """Issue 22's per-task path: a task ending and the next starting before the deferred write (just
    before the agent's next sample) cost one write; the snapshot the agent reads after it is exact."""
    pub, reader, turn = pair.pub, pair.reader, []
    pub.defer = turn.append  # the worker's loop.call_later(delay to the agent's next sample)
    before = pair.buf.version()
    pub.started("a", 1, 3)
    pub.ended("a")
    pub.started("b", 1, 3)
    assert pair.buf.version() == before and len(turn) == 1  # nothing written yet, one write due
    turn.pop()()  # the end of the turn
    assert pair.buf.version() == before + 2  # one write (the seqlock counts 2 per write)
    reader.refresh()
    assert [k for k, _, _ in reader().running] == ["b", "a"]  # b runs; a, unsampled, counts once
    pub.ended("b")
    pub.flush()  # before a wake: written now, the deferred call then finds nothing to do
    after = pair.buf.version()
    turn.pop()()
    assert pair.buf.version() == after


def test_an_ended_tasks_entry_is_encoded_once_however_many_writes_carry_it(pair, monkeypatch):
    """Entries are encoded at the write, not per task start; a recent task carried over several writes
    (the agent has not sampled it yet) is encoded once, a running one at each write (a few per worker)."""
    from dask_influx_metrics.link import snapshot

    encoded, entries = [], snapshot._entries
    monkeypatch.setattr(snapshot, "_entries", lambda tasks: encoded.extend(t[1] for t in tasks) or entries(tasks))
    pub = pair.pub
    pub.defer = lambda flush: None  # deferred writes: those below only
    for key in ("a", "b", "c"):
        pub.started(key, 1, 3)
        pub.ended(key)
    pub.started("d", 1, 3)
    pub.publish()
    pub.publish()
    assert sorted(encoded) == ["a", "b", "c", "d", "d"]
    pair.reader.refresh()
    assert [k for k, _, _ in pair.reader().running] == ["d", "a", "b", "c"]


def test_a_writes_entries_in_one_call_are_each_entry_as_written_alone():
    """A write encodes its tasks in one call of json's C encoder: the same bytes as :func:`entry` of each, for
    every kind of key Dask allows (str, bytes, int, float, tuples of them) and the odd ones around them."""
    from dask_influx_metrics.link import snapshot

    keys = ["ünï \"q\"\\", b"raw", 7, 2**70, 1.5, float("nan"), ("x", 0, ("nested", b"y", 2.0)), (True, None), ()]
    tasks = [(i + 1, key, i, 2 * i) for i, key in enumerate(keys)]
    assert snapshot._entries(tasks) == b",".join(entry(k, j, d, s) for s, k, j, d in tasks)
    assert snapshot._entries([]) == b""


def test_the_publisher_is_the_workers_record_and_syncs_with_tasks_that_changed_while_it_joined(pair):
    """Beside the agent the publisher alone records the executing tasks: ``ended`` gives the task's job
    and DAG (the task stream's record); ``sync`` catches up with a registry snapshot taken before the
    worker joined (a task ended meanwhile, another started)."""
    pub = pair.pub
    pub.started("old", 1, 2)
    pub.started("kept", 1, 2)
    assert not pub.idle()
    pub.sync([("kept", 1, 2), ("new", 3, 4)])
    assert sorted(pub._running) == ["kept", "new"]
    assert pub.ended("new") == (3, 4) and pub.ended("new") is None
    assert pub.ended("kept") == (1, 2) and pub.idle()
    pair.reader.refresh()
    assert [k for k, _, _ in pair.reader().running] == ["old", "new", "kept"]  # each once, as they ended


def test_a_wake_is_due_only_when_the_agents_latest_sample_saw_the_worker_idle(pair):
    """Issue 22: back-to-back short tasks send no wake datagram; the agent's beat says whom it saw idle."""
    reader = pair.beat_reader
    assert reader.saw_idle()  # no beat yet
    write_beat(pair.beat, 1, 1, 0, doc({"acked": {"w1": 1}, "idle": ["w1", "w2"]}))
    assert reader.saw_idle()
    write_beat(pair.beat, 1, 2, 0, doc({"acked": {"w1": 2}, "idle": ["w2"]}))
    assert not reader.saw_idle()
    write_beat(pair.beat, 1, 3, 0, doc({"acked": {"w1": 2}}))  # an agent that does not say: wake, as before
    assert reader.saw_idle()


def test_the_beat_carries_counts_each_workers_acknowledged_snapshot_and_the_sink_counters(pair):
    assert pair.beat_reader() is None and pair.beat_reader.acked() == 0  # no sample yet
    pair.pub.started("a", 1, 1)
    counters = [{"kind": "udp", "points_sent": 5}]
    write_beat(pair.beat, 42, 7, 2, doc({"acked": {"w1": pair.pub.seq, "w2": 9}, "counters": counters, "reports": []}))
    beat = pair.beat_reader()
    assert (beat["pid"], beat["samples"], beat["extra"], beat["counters"]) == (42, 7, 2, counters)
    assert 0 <= time.monotonic() - beat["time"] < 5
    assert pair.beat_reader.acked() == pair.pub.seq and BeatReader(pair.beat, "w2").acked() == 9
    assert BeatReader(pair.beat, "w3").acked() == 0  # a worker the agent has not sampled yet


def test_the_beats_per_sample_line_is_decoded_alone_the_rest_only_when_it_changed(pair):
    """The agent writes what changes every sample (``acked``, ``idle``) on a first line and the rest
    (counters, reports, what it found, its schedule) on a second: a worker's look at the beat once per
    sample decodes the short line; the second only when it changed."""
    rest = doc({"counters": [{"n": 1}], "ticks": [5.0, 0.05]})
    write_beat(pair.beat, 1, 1, 0, doc({"acked": {"w1": 1}, "idle": []}) + b"\n" + rest)
    beat = pair.beat_reader()
    assert (beat["acked"], beat["idle"], beat["counters"], beat["ticks"]) == ({"w1": 1}, [], [{"n": 1}], [5.0, 0.05])
    decoded = pair.beat_reader._decoded
    write_beat(pair.beat, 1, 2, 0, doc({"acked": {"w1": 2}, "idle": ["w1"]}) + b"\n" + rest)
    beat = pair.beat_reader()
    assert (beat["samples"], beat["acked"], beat["counters"]) == (2, {"w1": 2}, [{"n": 1}])
    assert pair.beat_reader._decoded is decoded and pair.beat_reader.saw_idle()


def test_a_beat_too_big_for_its_buffer_drops_reports_and_counters_but_keeps_the_acks(pair):
    reports = [{"what": "x", "message": "m" * 1000}] * (BEAT_BYTES // 1000)
    write_beat(pair.beat, 1, 3, 0, doc({"acked": {"w1": 5}, "counters": [{"n": 1}], "reports": reports}))
    beat = pair.beat_reader()
    assert (beat["samples"], beat["acked"], beat["counters"], beat["reports"]) == (3, {"w1": 5}, [], [])


def test_the_beat_is_read_again_only_once_it_was_rewritten(pair):
    pub, beat = pair.pub, pair.beat
    reads = []
    real = beat.read
    beat.read = lambda *a: reads.append(1) or real(*a)
    assert pair.beat_reader() is None and pub.acked() == 0  # nothing written yet
    pub.started("a", 1, 1)
    pair.sample()
    expected = pair.beat_reader()
    before = len(reads)
    assert pair.beat_reader() is expected and pair.beat_reader.acked() == pub.seq == pub.acked()
    assert len(reads) == before  # cached: the beat's version did not move
    for i in range(5):  # many task ends between two samples: no read at all
        pub.started(i, 1, 1)
        pub.ended(i)
    assert len(reads) == before and len(pub._recent) == 5
    pair.sample()
    assert pub.acked() == pub.seq and len(reads) == before + 1 and not pub._recent  # rewritten: read, pruned
    mm = beat._mm  # a beat being written (odd version) is not taken from the cache
    mm[0] = mm[0] | 1
    assert pair.beat_reader() is None and len(reads) == before + 2
    mm[0] = mm[0] & ~1
    assert pair.beat_reader.acked() == pub.seq


# --- the buffer -----------------------------------------------------------------------------
def test_a_buffer_in_a_file_is_read_through_another_mapping(tmp_path):
    path = str(tmp_path / "w.snap")
    writer = SnapshotBuffer.create(4096, path=path)
    reader = SnapshotBuffer.open(path, 4096)
    try:
        writer.write(b'{"ok": 1}')
        assert reader.read() == b'{"ok": 1}' and reader.version() == writer.version() == 2
        with pytest.raises(ValueError, match="do not fit"):
            writer.write(b"x" * 4096)
        assert reader.read() == b'{"ok": 1}'  # a refused write leaves the last one
    finally:
        writer.close()
        reader.close()
        reader.close()  # safe twice


def test_a_torn_or_half_written_snapshot_is_never_returned():
    buf = SnapshotBuffer.create(4096)
    try:
        buf.write(b'{"ok": 1}')
        view = SnapshotBuffer(buf.fd, buf.size, writable=True)  # a second mapping, to tamper
        view._mm[16] ^= 0xFF  # payload changed, sequence not: the CRC catches it
        assert buf.read(tries=3) is None
        view._mm[16] ^= 0xFF
        assert buf.read() == b'{"ok": 1}'
        view._mm[0] |= 1  # odd sequence: a write in progress
        assert buf.read(tries=3) is None
        view._mm.close()
    finally:
        buf.close()


def _consistent(snap) -> bool:
    """Writers below publish n tasks named k<i>/<n>, job n, dag n."""
    n = snap.executing
    return (
        len(snap.running) == n
        and snap.dag_tag == (str(n) if n else "0")
        and all(k == f"k{i}/{n}" and j == d == n for i, (k, j, d) in enumerate(snap.running))
    )


def _writer_snapshot(n: int) -> bytes:
    return encode_snapshot(n, 2, n, n, 0.0, [entry(f"k{i}/{n}", n, n, i) for i in range(n)], [])


WRITER = """
import sys, time
from dask_influx_metrics.link.seqlock import SnapshotBuffer
from dask_influx_metrics.link.snapshot import encode_snapshot, entry
buf = SnapshotBuffer(int(sys.argv[1]), int(sys.argv[2]), writable=True)
for it in range(int(sys.argv[3])):
    n = (it * 37) % 200
    buf.write(encode_snapshot(n, 2, n, n, 0.0, [entry(f"k{i}/{n}", n, n, i) for i in range(n)], []))
"""


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_concurrent_writer_and_reader_never_see_a_torn_snapshot(writer):
    buf = SnapshotBuffer.create(64 * 1024)
    iterations = 20000
    try:
        if writer == "thread":

            def write():
                for it in range(iterations):
                    buf.write(_writer_snapshot((it * 37) % 200))

            thread = threading.Thread(target=write)
            thread.start()
            running = thread.is_alive
        else:  # a real second process writing while this one reads: true parallelism
            proc = subprocess.Popen(
                [sys.executable, "-c", WRITER, str(buf.fd), str(buf.size), str(iterations)], pass_fds=(buf.fd,)
            )
            running = lambda: proc.poll() is None  # noqa: E731
        wait_until(lambda: buf.read() is not None or not running(), what="the first write")
        reader = SnapshotReader(buf)
        seen, deadline = 0, time.monotonic() + 60
        while running() and time.monotonic() < deadline:  # bounded
            reader.refresh()
            snap = reader()
            assert _consistent(snap), snap
            seen += snap.executing > 0
        if writer == "thread":
            thread.join(30)
        else:
            assert proc.wait(30) == 0
        reader.refresh()
        assert _consistent(reader()) and reader().executing == ((iterations - 1) * 37) % 200
        assert seen > 0
    finally:
        buf.close()
