"""A worker's outbox: written by the worker, read and sent by its host's agent, nothing lost or sent twice."""

import itertools
import os

from dask_influx_metrics.link import outbox
from dask_influx_metrics.link.outbox import Outbox, OutboxReader


def lines(a, b):
    return [b"task,worker=w key=\"k%d\" %d" % (i, i) for i in range(a, b)]


def test_segments_are_read_in_order_and_removed_once_sent(tmp_path):
    out = Outbox(str(tmp_path), "w", segment_bytes=200)
    reader = OutboxReader(str(tmp_path), "w")
    written = []
    for k in range(10):
        batch = lines(10 * k, 10 * k + 10)
        out.send(batch)
        written += batch
        assert reader.take() == batch
        reader.sent()
    segments = sorted(n for n in os.listdir(tmp_path) if ".out-" in n)
    assert len(segments) == 1, "every segment the agent sent whole is gone; the one written to stays"
    assert out.points_written == len(written) == 100


def test_a_new_reader_resumes_where_the_last_one_noted(tmp_path):
    out = Outbox(str(tmp_path), "w", segment_bytes=300)
    out.send(lines(0, 20))
    first = OutboxReader(str(tmp_path), "w")
    assert first.take() == lines(0, 20)
    first.sent()
    out.send(lines(20, 30))
    assert first.take() == lines(20, 30)  # taken, then the agent died before noting it was sent
    second = OutboxReader(str(tmp_path), "w")
    assert second.take() == lines(20, 30), "what was not noted as sent is sent by the next agent"
    second.sent()
    assert OutboxReader(str(tmp_path), "w").take() == []


def test_half_a_line_waits_for_its_end(tmp_path):
    out = Outbox(str(tmp_path), "w")
    reader = OutboxReader(str(tmp_path), "w")
    with open(tmp_path / "w.out-0", "ab") as f:
        f.write(b"m v=1i 1\nm v=2")  # a write the agent reads half-way through
    assert reader.take() == [b"m v=1i 1"]
    with open(tmp_path / "w.out-0", "ab") as f:
        f.write(b"i 2\n")
    assert reader.take() == [b"m v=2i 2"]
    out.close()


def test_remove_takes_every_file_of_the_outbox(tmp_path):
    out = Outbox(str(tmp_path), "w", segment_bytes=50)
    out.send(lines(0, 10))
    out.send(lines(10, 20))
    out.close()
    reader = OutboxReader(str(tmp_path), "w")
    assert reader.take() == lines(0, 20)
    reader.sent()
    reader.remove()
    assert os.listdir(tmp_path) == []


def test_a_backlog_goes_out_in_parts_of_whole_lines(tmp_path):
    out = Outbox(str(tmp_path), "w", segment_bytes=4000)
    out.send(lines(0, 500))  # ~13 kB over several segments
    reader = OutboxReader(str(tmp_path), "w")
    parts = []
    while part := reader.take(limit=2000):
        assert sum(len(line) + 1 for line in part) <= 2000 + 100, "about the limit"
        parts.append(part)
        reader.sent()
    assert len(parts) > 5 and [line for part in parts for line in part] == lines(0, 500)
    assert not reader.behind


def test_a_line_longer_than_the_limit_is_taken_whole(tmp_path):
    out = Outbox(str(tmp_path), "w")
    long = b'm s="%s" 1' % (b"x" * 5000)
    out.send([long, b"m v=1i 2"])
    reader = OutboxReader(str(tmp_path), "w")
    taken = reader.take(limit=100)
    assert taken[0] == long, "whole, though over the limit"
    assert taken + reader.take(limit=100) == [long, b"m v=1i 2"]


def test_a_newline_inside_a_string_field_stays_inside_its_line(tmp_path):
    out = Outbox(str(tmp_path), "w")
    multi = b'custom,worker=w text="two\nlines" 1'
    out.send([b"m v=1i 0", multi, b"m v=2i 2"])
    assert OutboxReader(str(tmp_path), "w").take() == [b"m v=1i 0", multi, b"m v=2i 2"]


def test_ids_and_move_take_every_file_of_an_outbox_elsewhere(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    out = Outbox(str(old), "7.1", segment_bytes=50)
    out.send(lines(0, 10))
    out.close()
    first = OutboxReader(str(old), "7.1")
    first.take(limit=60)
    first.sent()
    assert outbox.ids(str(old)) == {"7.1"}
    outbox.move(str(old), "7.1", str(new), "stale-s-7.1")
    assert os.listdir(old) == [] and outbox.ids(str(new)) == {"stale-s-7.1"}
    assert OutboxReader(str(new), "stale-s-7.1").take() == lines(0, 10)[2:], "from where the marker says"


# --- issue 43: a run folder with no room ------------------------------------------------------------------------
class Room:
    """A run folder of ``bytes`` free bytes (``os.write`` there writes what fits, then fails with ENOSPC, as on a
    full tmpfs); elsewhere (the spill folder on disk) writes go through."""

    def __init__(self, monkeypatch, folder, free):
        import errno
        import types

        self.folder, self.free = str(folder), free

        def write(fd, data):
            if not os.readlink(f"/proc/self/fd/{fd}").startswith(self.folder + os.sep):
                return os.write(fd, data)
            if self.free <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            n = min(len(data), self.free)
            self.free -= n
            return os.write(fd, bytes(data[:n]))

        monkeypatch.setattr(outbox, "os", types.SimpleNamespace(**{**vars(os), "write": write}))
        monkeypatch.setattr(outbox, "_free", lambda folder: self.free if folder == self.folder else 1 << 40)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def events_of(events, what):
    return [e for e in events if e[0] == what]


def test_a_full_run_folder_cuts_the_segment_to_whole_lines_and_moves_the_outbox_to_disk_and_back(tmp_path, monkeypatch):
    """Issue 43 items 1 and 2: a write cut short by ENOSPC leaves no half line (the next write starts on a line
    boundary), the rest goes to the spill folder on disk, said once; once there is room again, back, said once."""
    run, spill = tmp_path / "run", tmp_path / "spill"
    run.mkdir()
    room, clock, events = Room(monkeypatch, run, free=1 << 20), Clock(), []
    out = Outbox(str(run), "w", budget=1 << 20, spill=str(spill), clock=clock, report=lambda *a, **k: events.append(a))
    reader = OutboxReader(str(run), "w", spill=str(spill))
    got, sent = [], []
    for k in range(30):
        if k == 5:
            room.free = 1000  # full in the middle of the next write
        if k == 20:
            room.free, clock.now = 1 << 20, 10.0  # room again (looked at once a second)
        batch = lines(20 * k, 20 * k + 20)
        assert out.send(batch) == 20, "every line written whole, in one folder or the other"
        sent += batch
        got += reader.take()
        reader.sent()
    assert got == sent, "each line once, in order, whole"
    for name in os.listdir(run):
        if ".out-" in name:
            data = (run / name).read_bytes()
            assert not data or data.endswith(b"\n"), f"{name} ends in a half line"
    assert [e[1].split(":")[0] for e in events_of(events, "outbox")] == [
        f"no room for this worker's outbox in the run folder {run}",
        f"the run folder {run} has room again",
    ]
    assert "is full (No space left on device)" in events[0][1]
    left = 1000 - sum(len(x) + 1 for x in lines(100, 120))  # after the write at k = 5
    fit = sum(1 for n in itertools.accumulate(len(x) + 1 for x in lines(120, 140)) if n <= left)
    spilled = 20 - fit + 13 * 20  # what did not fit of the write at k = 6, then k = 7 to 19
    assert out.points_dropped == 0 and not events_of(events, "outbox-lost")
    assert out.counters() == [{"kind": "outbox", "points_written": 600, "points_spilled": spilled, "points_dropped": 0}]


def test_points_neither_folder_takes_are_counted_and_reported_exactly(tmp_path, monkeypatch):
    """Issue 43: with no folder on disk to go to, what does not fit is lost: counted (delivery()) and reported with
    its number (the events' points add up to the count); the lines kept are read whole, once."""
    run = tmp_path / "run"
    run.mkdir()
    room, events = Room(monkeypatch, run, free=1 << 20), []
    out = Outbox(str(run), "w", budget=1 << 20, spill=None, report=lambda what, msg, **d: events.append((what, d)))
    reader = OutboxReader(str(run), "w")
    kept, got = [], []
    for k in range(20):
        room.free = 700 if k == 4 else (0 if 4 < k < 12 else 1 << 20)
        batch = lines(10 * k, 10 * k + 10)
        n = out.send(batch)
        kept += batch[:n]
        got += reader.take()
        reader.sent()
    out.close()
    lost = 200 - len(kept)
    assert got == kept and 0 < lost < 200
    assert out.points_dropped == lost == sum(d["points"] for what, d in events if what == "outbox-lost")
    assert len(events_of(events, "outbox-lost")) == 2, "when it starts, and the count when it ends"


def test_the_budget_bounds_what_an_outbox_holds_in_the_run_folder(tmp_path):
    """Issue 43 item 2: with its agent gone, a worker's outbox holds at most its budget (plus one write) in the run
    folder; the rest waits on disk; the next agent sends all of it, in order, and the outbox comes back."""
    run, spill = tmp_path / "run", tmp_path / "spill"
    run.mkdir()
    clock, events = Clock(), []
    budget = 64 << 10
    out = Outbox(str(run), "w", budget=budget, spill=str(spill), clock=clock, report=lambda *a, **k: events.append(a))
    written = []
    for k in range(100):  # ~200 kB, nobody reading
        batch = lines(50 * k, 50 * k + 50)
        out.send(batch)
        written += batch
        held = sum(os.path.getsize(run / n) for n in os.listdir(run) if ".out-" in n)
        assert held <= budget + 2000
    assert out.points_spilled > 0 and len(events) == 1 and "budget of 65536 bytes" in events[0][1]
    reader = OutboxReader(str(run), "w", spill=str(spill))
    got = []
    while part := reader.take(limit=16 << 10):
        got += part
        reader.sent()
    assert got == written
    clock.now = 5.0
    out.send(lines(0, 1))
    assert len(events) == 2 and "room again" in events[1][1]
    assert not [n for n in os.listdir(spill) if n != f"w.out-{out._k - 1}"], "what was sent is gone from the disk"


def test_lines_a_sink_did_not_take_are_taken_again(tmp_path):
    """Issue 43 item 3: the agent notes only what its sink took; the rest is given again at the next sample, from
    the same place, across segments."""
    out = Outbox(str(tmp_path), "w", segment_bytes=200)
    out.send(lines(0, 20))
    reader = OutboxReader(str(tmp_path), "w")
    assert reader.take() == lines(0, 20)
    reader.sent(7)
    assert reader.behind and reader.take() == lines(7, 20)
    reader.sent(0)
    assert reader.take() == lines(7, 20)
    reader.sent()
    assert reader.take() == [] and OutboxReader(str(tmp_path), "w").take() == []


def test_the_agents_note_of_what_was_sent_never_needs_room(tmp_path):
    """The worker makes the ``.sent`` file whole when it starts: the agent's one pwrite never allocates a page."""
    Outbox(str(tmp_path), "w").close()
    assert os.path.getsize(tmp_path / "w.sent") == outbox.MARKER_BYTES


# --- issue 46: an idle worker costs its agent no system call ----------------------------------------------------
def test_an_idle_outbox_is_looked_at_without_a_system_call_and_a_write_is_seen_at_once(tmp_path, monkeypatch):
    import types

    out = Outbox(str(tmp_path), "w", segment_bytes=200)
    reader = OutboxReader(str(tmp_path), "w")
    out.send(lines(0, 5))
    assert reader.take() == lines(0, 5)
    reader.sent()
    calls = []

    def counted(name, module=os):
        real = getattr(module, name)
        return lambda *a, **k: calls.append(name) or real(*a, **k)

    names = ("open", "fstat", "stat", "pread", "pwrite", "lstat")
    fake_os = types.SimpleNamespace(**{**vars(os), **{n: counted(n) for n in names}})
    fake_os.path = types.SimpleNamespace(**{**vars(os.path), "exists": counted("exists", os.path)})
    monkeypatch.setattr(outbox, "os", fake_os)
    for _ in range(3):
        assert reader.take() == []
        reader.sent()
    assert calls == [], "nothing written since the last look: no file looked at"
    out.send(lines(5, 20))  # past the segment's end: a new segment too
    assert reader.take() == lines(5, 20) and calls, "the writer's count changed: read at the next take"
    reader.sent()
    out.close()


def test_lines_a_writer_did_not_count_are_read_once_it_is_not_trusted(tmp_path):
    """A worker killed between its write and its count: the agent reads its files whatever the count says once it
    knows the worker is gone (``trust`` off), before it removes them."""
    out = Outbox(str(tmp_path), "w")
    reader = OutboxReader(str(tmp_path), "w")
    assert reader.take() == []
    with open(tmp_path / "w.out-0", "ab") as f:  # written, not counted: the writer died in between
        f.write(b"m v=1i 1\n")
    assert reader.take() == [], "a live writer counts each write: nothing counted, nothing looked at"
    reader.trust = False
    assert reader.take() == [b"m v=1i 1"]
    out.close()


def test_an_outbox_of_a_writer_that_counts_nothing_is_read_at_every_take(tmp_path):
    """A ``.sent`` file of the layout before the count (16 bytes): no count to go by, the files are read."""
    (tmp_path / "w.sent").write_bytes(bytes(16))
    reader = OutboxReader(str(tmp_path), "w")
    assert reader.take() == []
    (tmp_path / "w.out-0").write_bytes(b"m v=1i 1\n")
    assert reader.take() == [b"m v=1i 1"]
