"""The worker <-> sidecar shared memory: the seqlock buffer, the snapshot (executing and recent
tasks) with its publisher and reader, and the heartbeat."""

import subprocess
import sys
import threading
import time

import pytest

from dask_influx_metrics.worker.shared import (
    BEAT_BYTES, Publisher, SnapshotBuffer, SnapshotReader, decode_snapshot, encode_snapshot, entry, read_beat,
)
from dask_influx_metrics.worker.sources.activity import key_json
from test_sidecar import wait_until




@pytest.fixture
def pair():
    """A publisher and a reader over a fresh snapshot buffer and heartbeat (nthreads 4)."""
    buf, beat = SnapshotBuffer.create(1 << 16), SnapshotBuffer.create(BEAT_BYTES)
    pub = Publisher(buf, beat, nthreads=4)
    yield pub, SnapshotReader(buf, beat)
    buf.close()
    beat.close()


# --- the snapshot -------------------------------------------------------------------------
def test_snapshot_round_trip_keeps_keys_counts_tags_bytes_and_clock_offset(pair):
    pub, reader = pair
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
    pub, reader = pair
    pub.started("long", 1, 1)
    reader.refresh()
    pub.started("brief", 2, 7)
    pub.ended("brief")
    pub.started("seen", 2, 8)
    reader.refresh()
    assert [k for k, _, _ in reader().running] == ["long", "seen", "brief"]
    assert (reader().executing, reader().job_tag, reader().dag_tag) == (3, "1,2", "1,7,8")
    pub.ended("seen")  # a sample saw it running: not carried
    assert not reader.unsampled()
    reader.refresh()
    assert (reader().executing, reader().dag_tag) == (1, "1")
    pub.started("last", 3, 9)
    pub.ended("last")
    assert reader.unsampled()  # a final sample at exit would show it
    reader.refresh()
    assert reader().dag_tag == "1,9" and not reader.unsampled()


def test_the_publisher_prunes_what_the_sidecar_acknowledged_and_folds_beyond_keep(pair):
    pub, reader = pair
    for i in range(3):
        pub.started(i, 1, 1)
        pub.ended(i)
    assert len(pub._recent) == 3
    reader.refresh()
    assert read_beat(reader._beat).acked == pub.seq == pub.acked()
    assert len(pub._recent) == 0  # pruned: the sidecar sampled them
    pub._keep = 5
    for i in range(10, 20):
        pub.started(i, 1, 1 + i % 2)
        pub.ended(i)
    assert len(pub._recent) <= 5
    reader.refresh()
    keys = [k for k, _, _ in reader().running]
    assert keys[-3:] == [17, 18, 19] and None in keys  # the latest with keys, older ones folded
    assert reader().dag_tag == "1,2"  # tags exact


def test_the_heartbeat_carries_counts_the_acknowledged_snapshot_and_the_sink_counters(pair):
    pub, reader = pair
    assert read_beat(reader._beat) is None  # no sample yet

    class Counts:
        samples, extra = 7, 2

    reader.sampler = Counts()
    pub.started("a", 1, 1)
    reader.refresh()
    beat = read_beat(reader._beat)
    assert (beat.samples, beat.extra, beat.acked, beat.counters) == (7, 2, pub.seq, b"[]")
    assert 0 <= time.monotonic() - beat.time < 5
    reader.set_counters(b'[{"kind": "udp", "points_sent": 5}]')  # written at once, not at the next sample
    assert read_beat(reader._beat).counters == b'[{"kind": "udp", "points_sent": 5}]'


def test_the_publisher_reads_the_heartbeat_again_only_once_it_was_rewritten(pair):
    pub, reader = pair
    reads = []
    real = pub._beat.read
    pub._beat.read = lambda *a: reads.append(1) or real(*a)
    assert pub.beat() is None and pub.acked() == 0  # nothing written yet
    pub.started("a", 1, 1)
    reader.refresh()
    expected = read_beat(reader._beat)  # (the same buffer: counted too)
    before = len(reads)
    assert pub.beat() == expected and pub.beat().acked == pub.seq == pub.acked()
    assert len(reads) == before + 1  # cached: the heartbeat's version did not move
    for i in range(5):  # many task ends between two samples: no read at all
        pub.started(i, 1, 1)
        pub.ended(i)
    assert len(reads) == before + 1 and len(pub._recent) == 5
    reader.refresh()
    assert pub.acked() == pub.seq and len(reads) == before + 2 and not pub._recent  # rewritten: read, pruned
    mm = pub._beat._mm  # a heartbeat being written (odd version) is not taken from the cache
    mm[0] = mm[0] | 1
    assert pub.beat() is None and len(reads) == before + 3
    mm[0] = mm[0] & ~1
    assert pub.beat().acked == pub.seq


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
    return (len(snap.running) == n and snap.dag_tag == (str(n) if n else "0")
            and all(k == f"k{i}/{n}" and j == d == n for i, (k, j, d) in enumerate(snap.running)))


def _writer_snapshot(n: int) -> bytes:
    return encode_snapshot(n, 2, n, n, 0.0, [entry(f"k{i}/{n}", n, n, i) for i in range(n)], [])


WRITER = """
import sys, time
from dask_influx_metrics.worker.shared import SnapshotBuffer, encode_snapshot, entry
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
            proc = subprocess.Popen([sys.executable, "-c", WRITER, str(buf.fd), str(buf.size), str(iterations)],
                                    pass_fds=(buf.fd,))
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


