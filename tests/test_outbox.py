"""A worker's outbox: written by the worker, read and sent by its host's agent, nothing lost or sent twice."""

import os

from dask_influx_metrics import outbox
from dask_influx_metrics.outbox import Outbox, OutboxReader


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
