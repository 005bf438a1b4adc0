"""Sender: a sample's one way out (issue 46 item 2): forwarded lines first, then the sample's, then the
delivery points when due, in one take; what the sink could not take of the sample's own lines is sent (and
counted where it fails); the caller learns how many forwarded lines went."""

from dask_influx_metrics import lineparse
from dask_influx_metrics.sinks import HEALTH_INTERVAL
from dask_influx_metrics.sinks.sender import Sender


class Partial:
    """A sink that keeps at most ``room`` lines a take; what it is sent past that is counted as refused."""

    def __init__(self, room=10**9):
        self.room, self.kept, self.sent, self.flushes = room, [], [], 0

    def take(self, lines):
        n = min(self.room, len(lines))
        self.kept += lines[:n]
        return n

    def send(self, lines):
        self.sent += lines

    def flush(self, drain=0.0):
        self.flushes += 1

    def delivery(self):
        return [{"sink": "udp", "points_sent": len(self.kept)}]


def measurements(lines):
    return [lineparse.parse(line).measurement for line in lines]


def test_forwarded_lines_go_first_then_the_samples_then_the_delivery_points_in_one_flushed_take():
    sink, now = Partial(), [1000.0]
    sender = Sender(sink, {"host": "h", "worker": "agent-h"}, clock=lambda: now[0])
    assert sender.send([b"host cpu_percent=1 1"], [b"task duration=2 1", b"custom v=3 1"]) == 2
    assert measurements(sink.kept) == ["task", "custom", "host", "delivery"] and sink.flushes == 1
    now[0] += HEALTH_INTERVAL / 2  # not due again yet
    assert sender.send([b"host cpu_percent=2 2"]) == 0
    assert measurements(sink.kept[4:]) == ["host"]
    now[0] += HEALTH_INTERVAL / 2
    sender.send([b"host cpu_percent=3 3"])
    assert measurements(sink.kept[5:]) == ["host", "delivery"]
    sender.health_now()  # a stopping sampler's last counts
    sender.send([])
    assert measurements(sink.kept[7:]) == ["delivery"]


def test_what_the_sink_cannot_take_of_the_samples_own_lines_is_sent_and_forwarded_lines_stay_behind():
    sink = Partial(room=3)
    sender = Sender(sink, None)  # no delivery points
    own = [b"host cpu_percent=%d %d" % (i, i) for i in range(3)]
    assert sender.send(own, [b"task duration=1 1", b"task duration=2 2"]) == 2
    assert sink.kept[2:] == own[:1] and sink.sent == own[1:], "the sample's rest: sent, counted where it fails"
    sink.kept, sink.sent = [], []
    assert sender.send(own, [b"task duration=%d %d" % (i, i) for i in range(5)]) == 3
    assert sink.sent == own, "none of the sample's own lines fit: all sent"
