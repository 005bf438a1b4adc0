"""JournaledHttpSink (issue 43 items 3 and 5): every line on disk (``undelivered/``) before it is posted, posted
from there, removed once the server has it; an outage or a killed sender's copy goes by itself, in order, once."""

from __future__ import annotations

import threading

from faults import Switchable
from polling import wait_until

from dask_influx_metrics.sinks.http import HttpOptions
from dask_influx_metrics.sinks.journal import Journal, JournaledHttpSink
from dask_influx_metrics.sinks.spool import read_lines, spool_files

BASE_NS = 1_700_000_000_000_000_000


def numbered(a, b):
    return [b"m,t=x v=%di %d" % (i, BASE_NS + i) for i in range(a, b)]


class Server(Switchable):
    """An InfluxDB stand-in that keeps every line posted to it (204)."""

    def __init__(self):
        self.lines, self.posts = [], 0
        super().__init__()

    def post(self, path, body):
        self.posts += 1
        self.lines += [line for line in body.split(b"\n") if line]
        return 204, b""


def sink_for(server, folder, events=None, **options):
    options = {"flush_interval": 0.05, "batch_size": 100, "timeout": 2, **options}
    report = None if events is None else (lambda what, message, **d: events.append((what, message, d)))
    return JournaledHttpSink(server.url, "db", HttpOptions(**options), journal=folder, report=report)


def test_every_line_is_on_disk_before_it_is_posted_and_leaves_the_disk_once_posted(tmp_path):
    server = Server()
    # less than a batch and an hour's flush: posted only when drained (a full batch would go at once)
    sink = sink_for(server, tmp_path / "undelivered", flush_interval=3600, batch_size=1000)
    try:
        assert sink.take(numbered(0, 250)) == 250
        assert list(read_lines(tmp_path / "undelivered")) == numbered(0, 250), "on disk before any post"
        assert server.posts == 0
        assert sink.drain(10)
        assert server.lines == numbered(0, 250) and spool_files(tmp_path / "undelivered") == []
    finally:
        sink.close()
        server.down()
    assert (sink.points_written, sink.points_failed, sink.pending) == (250, 0, 0)


def test_an_outage_goes_by_itself_in_order_and_once_when_the_server_answers_again(tmp_path):
    server, events = Server(), []
    sink = sink_for(server, tmp_path / "undelivered", events)
    sink.max_backoff = 0.3
    try:
        sink.send(numbered(0, 50))
        wait_until(lambda: len(server.lines) == 50, what="the first lines posted")
        server.down()
        for k in range(1, 11):  # ~1 s of an outage, a sample every 0.1 s
            sink.send(numbered(50 * k, 50 * k + 50))
            threading.Event().wait(0.1)
        wait_until(lambda: sink.points_failed, what="a failed post")
        kept = list(read_lines(tmp_path / "undelivered"))
        assert kept and set(kept) <= set(numbered(50, 550)), "what the server did not take waits on disk"
        server.up()
        wait_until(lambda: len(server.lines) >= 550 and not spool_files(tmp_path / "undelivered"), what="sent")
        sink.send(numbered(550, 600))
        assert sink.drain(10)
    finally:
        sink.close()
        server.down()
    assert server.lines == numbered(0, 600), "every line once, in order"
    assert sink.points_written == 600 and sink.points_failed == sink.points_spooled > 0
    assert [what for what, _, _ in events] == ["http-replay", "http-replayed"]
    assert events[0][2]["lines"] == events[1][2]["lines"] > 0 and "oldest first" in events[0][1]
    [delivery] = sink.delivery()
    assert (delivery["points_sent"], delivery["points_dropped"]) == (600, 0)


def test_what_a_killed_sender_left_is_sent_first_by_the_next_one(tmp_path):
    """An agent killed with lines on disk not posted: its successor (same folder) posts them first, says so."""
    folder = tmp_path / "undelivered"
    dead = Journal(folder, max_lines=40)
    for k in range(5):  # written, never posted; the last one torn by the kill
        dead.append(numbered(40 * k, 40 * k + 40))
    with open(spool_files(folder)[-1], "ab") as f:
        f.write(b"m,t=x v=9")
    server, events = Server(), []
    sink = sink_for(server, folder, events)
    try:
        sink.send(numbered(200, 220))
        wait_until(lambda: len(server.lines) >= 220, what="sent")
        assert sink.drain(10)
    finally:
        sink.close()
        server.down()
    assert server.lines == numbered(0, 220) and spool_files(folder) == []
    assert events[0][0] == "http-replay" and events[0][2]["lines"] == 200 and "stopped" in events[0][1]
    assert events[-1][0] == "http-replayed"


def test_lines_no_disk_takes_are_posted_from_memory_and_counted_when_lost(tmp_path):
    """take() says what the disk took (the agent keeps the rest in its workers' outboxes); send() posts what the
    disk refused from memory, and counts it as lost when the server does not take it either."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    server = Server()
    sink = sink_for(server, blocker / "undelivered")  # a folder under a file: never made
    try:
        assert sink.take(numbered(0, 10)) == 0 and server.lines == []
        sink.send(numbered(0, 10))
        assert sink.drain(10) and server.lines == numbered(0, 10)
        server.down()
        sink.send(numbered(10, 20))
        wait_until(lambda: sink.points_lost == 10, what="counted as lost")
    finally:
        sink.close()
    assert sink.delivery()[0]["points_dropped"] == 10
