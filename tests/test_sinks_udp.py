"""UdpSink: datagram packing with a fake socket, error handling, and real delivery to influxd."""

from __future__ import annotations

import logging
import socket
import time
import uuid

import pytest
from telegraf import TelegrafClient

from dask_influx_metrics import lineprotocol as lp
from dask_influx_metrics.schema import Point
from dask_influx_metrics.sinks.udp import MAX_UDP_PAYLOAD, UdpSink, pack

BASE_NS = 1_700_000_000_000_000_000


class FakeSocket:
    def __init__(self, fail_with=None):
        self.sent: list[bytes] = []
        self.fail_with = fail_with
        self.closed = False

    def sendto(self, data, address):
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append(bytes(data))
        return len(data)

    def close(self):
        self.closed = True


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def lines_of(lengths):
    return [(b"m%d v=" % i).ljust(n, b"x") for i, n in enumerate(lengths)]


@pytest.mark.parametrize(
    "host, size",
    [
        ("127.0.0.1", 65507),
        ("127.8.9.10", 65507),
        ("::1", 65507),
        ("localhost", 65507),
        ("10.1.2.3", 1472),
        ("telegraf.example", 1472),
    ],
)
def test_auto_datagrams_are_as_large_as_udp_allows_on_loopback_only(host, size):
    assert UdpSink((host, 9), sock=FakeSocket()).max_datagram == size  # nothing is sent


def test_auto_datagrams_are_as_large_as_udp_allows_to_this_machines_own_address():
    """Issue 32: datagrams to one of this machine's own addresses go over the loopback interface (MTU 64 KiB):
    packed as full as UDP allows, one sendto per sample instead of one per 1472 bytes. Nothing is sent."""
    import psutil

    own = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET]
    own = [a for a in own if not a.startswith("127.")]
    if not own:
        pytest.skip("this machine has no IPv4 address but loopback")
    assert UdpSink((own[0], 9), sock=FakeSocket()).max_datagram == MAX_UDP_PAYLOAD
    assert UdpSink(("198.51.100.7", 9), sock=FakeSocket()).max_datagram == 1472  # TEST-NET-2: another machine


def test_auto_datagram_size_follows_the_resolved_address():
    import socket as _socket

    family, kind, proto, _, target = _socket.getaddrinfo("localhost", 0, type=_socket.SOCK_DGRAM)[0]
    with _socket.socket(family, kind, proto) as receiver:
        receiver.bind(target)  # where the sink's own lookup of "localhost" will send
        receiver.settimeout(5)
        sink = UdpSink(("localhost", receiver.getsockname()[1]))
        lines = [b"m v=%di %d" % (i, BASE_NS + i) for i in range(2000)]  # ~55 kB
        sink.send(lines)
        assert sink.max_datagram == MAX_UDP_PAYLOAD and sink.datagrams_sent == 1
        assert receiver.recv(1 << 16).split(b"\n") == lines
        sink.close()


@pytest.mark.parametrize("max_datagram", [1, 50, 512, 1472, 9000])
def test_datagrams_are_bounded_and_carry_every_line_in_order(max_datagram):
    lengths = [(i * 7919) % 3000 + 10 for i in range(400)] + [70000, 65507, 65508]
    lines = lines_of(lengths)
    sock = FakeSocket()
    sink = UdpSink(("127.0.0.1", 9), max_datagram=max_datagram, sock=sock)
    sink.send(lines)
    kept = [line for line in lines if len(line) <= MAX_UDP_PAYLOAD]
    for datagram in sock.sent:
        assert len(datagram) <= max_datagram or b"\n" not in datagram
    assert b"\n".join(sock.sent).split(b"\n") == kept
    assert sink.points_sent == len(kept) and sink.datagrams_sent == len(sock.sent)
    assert sink.points_dropped == 2  # 70000 and 65508 bytes: larger than any UDP payload


def test_a_line_too_long_for_a_datagram_goes_without_its_longest_string_field_said_once():
    """Issue 43 item 6: a task key longer than a datagram in a worker sample's ``running`` list: the sample goes
    without that field (never cut: its JSON would not parse), the sample's other lines as they are."""
    from dask_influx_metrics import lineparse

    key = "k" * 70_000
    worker = Point("worker", {"host": "h", "worker": "w"}, {"tasks": 1, "running": f'["{key}"]', "rss": 7.0}, BASE_NS)
    gpu = Point("gpu", {"host": "h", "uuid": "GPU-1"}, {"utilization_gpu": 50.0}, BASE_NS)
    sock, said = FakeSocket(), []
    sink = UdpSink(("127.0.0.1", 9), sock=sock, report=lambda what, message: said.append((what, message)))
    for _ in range(3):
        sink.send(lp.encode_many([gpu, worker, gpu]))
    sent = [lineparse.parse(line) for datagram in sock.sent for line in datagram.split(b"\n")]
    assert [p.measurement for p in sent] == ["gpu", "worker", "gpu"] * 3
    assert sent[1].fields == {"tasks": 1, "rss": 7.0} and sent[1].tags == worker.tags
    assert sink.points_sent == 9 and sink.points_dropped == 0
    [(what, message)] = said
    assert what == "udp-long-line" and "without its field(s) ['running']" in message and len(message) < 300


def test_take_stops_at_the_first_datagram_that_cannot_go_and_leaves_the_rest_uncounted():
    """Issue 43 item 3: the agent's outbox lines are marked sent only as far as datagrams went."""

    class FullAfter(FakeSocket):
        def sendto(self, data, address):
            if len(self.sent) >= 2:
                raise BlockingIOError(11, "Resource temporarily unavailable")
            return super().sendto(data, address)

    sink = UdpSink(("127.0.0.1", 9), max_datagram=20, sock=FullAfter())
    lines = [b"m v=%di %d" % (i, i) for i in range(10)]  # two a datagram
    assert sink.take(lines) == 4
    assert (sink.points_sent, sink.points_dropped) == (4, 0)


def test_pack_fills_datagrams_exactly():
    datagrams, too_long = pack([b"a" * 10] * 4, 21)  # two 10-byte lines + newline = 21
    assert [count for _, count in datagrams] == [2, 2] and too_long == 0


def test_oserror_is_logged_once_resets_socket_and_recovers(caplog):
    clock, made = Clock(), []
    broken = FakeSocket(fail_with=OSError(101, "Network is unreachable"))

    def factory():
        made.append(FakeSocket() if made else broken)
        return made[-1]

    sink = UdpSink(("127.0.0.1", 9), sock=factory, clock=clock)
    with caplog.at_level(logging.WARNING, logger="dask_influx_metrics.sinks.udp"):
        for _ in range(5):
            sink.send([b"m v=1i 1"])
    assert len([r for r in caplog.records if "cannot send" in r.message]) == 1
    assert broken.closed and sink.points_dropped == 5 and sink.points_sent == 0
    clock.now += 1.5  # past the re-open back-off
    sink.send([b"m v=2i 2"])
    assert made[-1].sent == [b"m v=2i 2"] and sink.points_sent == 1


def test_socket_is_reopened_periodically():
    clock, made = Clock(), []
    sink = UdpSink(("127.0.0.1", 9), sock=lambda: made.append(FakeSocket()) or made[-1], reopen_every=60.0, clock=clock)
    sink.send([b"a v=1i"])
    clock.now += 30
    sink.send([b"b v=1i"])
    clock.now += 31
    sink.send([b"c v=1i"])
    assert [s.sent for s in made] == [[b"a v=1i", b"b v=1i"], [b"c v=1i"]]
    assert made[0].closed and not made[1].closed


def test_full_send_buffer_drops_without_blocking_or_resetting():
    sock = FakeSocket(fail_with=BlockingIOError(11, "Resource temporarily unavailable"))
    sink = UdpSink(("127.0.0.1", 9), max_datagram=10, sock=sock)
    sink.send([b"m v=1i", b"m v=2i", b"m v=3i"])
    assert sink.points_dropped == 3 and not sock.closed


def test_send_never_raises():
    def cannot_open():
        raise OSError(-2, "Name or service not known")

    sink = UdpSink(("127.0.0.1", 9), sock=cannot_open)
    sink.send([b"m v=1i 1"])  # the socket cannot be opened: dropped and logged
    sink.send([None])  # garbage: logged, not raised
    assert sink.points_dropped >= 1
    sink.close()


def test_points_land_in_influxd_with_their_tags(influxd):
    measurement = "udp_" + uuid.uuid4().hex[:10]
    points = [
        Point(
            measurement,
            {"worker": f"tcp://10.0.0.{i % 3}:4000", "job": str(i % 2)},
            {"v": float(i), "n": i},
            BASE_NS + i,
        )
        for i in range(300)
    ]
    sink = UdpSink(influxd.udp_address)
    sink.send(lp.encode_many(points))
    sink.close()
    rows = influxd.wait_for(f'SELECT * FROM "{measurement}"', 300)
    assert sink.datagrams_sent < 300 / 5  # lines were batched
    by_time = {r["time"]: r for r in rows}
    for p in points:
        row = by_time[p.time_ns]
        assert (row["worker"], row["job"], row["v"], row["n"]) == (
            p.tags["worker"],
            p.tags["job"],
            p.fields["v"],
            p.fields["n"],
        )


def test_pytelegraf_points_sit_beside_ours(influxd):
    measurement = "mixed_" + uuid.uuid4().hex[:10]
    host, port = influxd.udp_address
    theirs = TelegrafClient(host=host, port=port)
    theirs.metric(measurement, {"value": 2.5, "count": 7}, tags={"src": "pytelegraf", "host": "h1"})
    ours = UdpSink(influxd.udp_address)
    ours.send([lp.encode(Point(measurement, {"src": "ours", "host": "h1"}, {"value": 1.5, "count": 3}, BASE_NS))])
    rows = influxd.wait_for(f'SELECT * FROM "{measurement}"', 2)
    theirs.socket.close()
    ours.close()
    assert {(r["src"], r["host"], r["value"], r["count"]) for r in rows} == {
        ("pytelegraf", "h1", 2.5, 7),
        ("ours", "h1", 1.5, 3),
    }
    fields = influxd.query(f'SHOW FIELD KEYS FROM "{measurement}"')
    assert {(r["fieldKey"], r["fieldType"]) for r in fields} == {("value", "float"), ("count", "integer")}


def test_refusals_on_loopback_are_counted_and_reported_once():
    import socket as _socket

    probe = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens on this port now
    reports = []
    sink = UdpSink(("127.0.0.1", port), report=lambda what, message: reports.append((what, message)))
    deadline, lines = time.monotonic() + 10, 0
    while sink.refused < 5 and time.monotonic() < deadline:
        sink.send([b"m v=1i 1"])
        lines += 1
        time.sleep(0.001)  # let the ICMP port-unreachable come back
    assert sink.refused >= 5 and sink.points_sent + sink.points_dropped == lines
    assert sink.points_sent <= 2  # at most the last datagrams, whose refusal has not come back yet
    assert len(reports) == 1 and reports[0][0] == "udp-refused" and f"127.0.0.1:{port}" in reports[0][1]
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", port))
    listener.settimeout(5)
    try:
        sink.send([b"m v=2i 2"])
        assert listener.recv(100) == b"m v=2i 2"  # the connected socket delivers once someone listens
    finally:
        listener.close()
        sink.close()


def test_each_refusal_outage_is_told_when_it_starts_and_when_it_ends():
    """Issue 23 item 13: a second outage of the Telegraf listener is reported too, and each end once."""
    import socket as _socket

    probe = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    reports = []
    sink = UdpSink(("127.0.0.1", port), report=lambda what, message: reports.append((what, message)))

    def send_until(done):
        deadline = time.monotonic() + 10
        while not done() and time.monotonic() < deadline:
            sink.send([b"m v=1i 1"])
            time.sleep(0.002)  # let the ICMP port-unreachable come back
        assert done(), reports

    try:
        for outage in (1, 2):
            send_until(lambda: [w for w, _ in reports].count("udp-refused") == outage)
            listener = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
            listener.bind(("127.0.0.1", port))
            try:
                send_until(lambda: [w for w, _ in reports].count("udp-listening") == outage)
                for _ in range(20):
                    sink.send([b"m v=2i 2"])
            finally:
                listener.close()
    finally:
        sink.close()
    assert [w for w, _ in reports] == ["udp-refused", "udp-listening"] * 2
    assert "datagram(s) were refused meanwhile" in reports[1][1] and f"127.0.0.1:{port}" in reports[3][1]
