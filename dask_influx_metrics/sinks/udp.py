"""UDP sink: line protocol datagrams to Telegraf's ``socket_listener`` (or InfluxDB 1.x ``[[udp]]``).

Lines are packed, newline-joined, into datagrams of at most ``max_datagram``
bytes. By default (``None``, the setting's ``auto``) that is 65507, the UDP
maximum, when Telegraf is on this machine (loopback, or one of its own addresses:
the kernel delivers those over the loopback interface, MTU 64 KiB: nothing is fragmented, and
Telegraf's ``socket_listener`` and InfluxDB 1.x's ``[[udp]]`` read up to 64 KiB
a datagram), else 1472 (a 1500-byte Ethernet MTU minus IP and UDP headers). A
line longer than that goes alone, up to 65507 bytes; a longer one goes without its
longest string field(s) (a worker sample's list of task keys, a custom text), said
once; one with none to leave out is dropped and counted, the sample's other lines
sent. Sends are non-blocking: a
full socket buffer drops that datagram (counted) rather than stalling the
sampler; :meth:`UdpSink.take` (the agent, for its workers' outboxes) stops there
instead and leaves the rest to the caller, uncounted. A socket error is
logged once per run of failures and resets the socket, which is also re-opened
every ``reopen_every`` seconds, because a stale conntrack entry left by a
restarted Telegraf pod can black-hole UDP.

On loopback the socket is connected, so the kernel reports a refused datagram
(ICMP port unreachable: nothing listens) as ``ECONNREFUSED`` on the next send:
that earlier datagram is moved from sent to dropped and counted in ``refused``,
and the current one is sent again. Each such outage is told once when it starts
(a warning, and ``report("udp-refused", message)``) and once when it ends (the
next send that finds no refusal: info, and ``report("udp-listening", message)``
with the datagrams refused meanwhile). Off-host refusals are not visible
(unconnected socket).

>>> class Fake:
...     def __init__(self): self.sent = []
...     def sendto(self, data, address): self.sent.append(data); return len(data)
...     def close(self): pass
>>> sink = UdpSink(("127.0.0.1", 8094), max_datagram=20, sock=Fake())
>>> sink.send([b"m v=1i 1", b"m v=2i 2", b"m v=3i 3"])
>>> sink.datagrams_sent, sink.points_sent
(2, 3)
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from typing import Optional

from .. import lineparse, lineprotocol
from ..notices import Once

logger = logging.getLogger(__name__)

MAX_UDP_PAYLOAD = 65507  # 65535 - 8 (UDP header) - 20 (IPv4 header)
ETHERNET_PAYLOAD = 1472  # 1500 (Ethernet MTU) - 8 - 20
_SEND_BUFFER = 1 << 20
_RETRY_OPEN_AFTER = 1.0  # seconds to wait before re-opening after a failure


class _Socket:
    """A non-blocking datagram socket; a connected one (loopback) sends with ``send``."""

    def __init__(self, sock: socket.socket, connected: bool):
        self.sock, self._connected = sock, connected

    def sendto(self, data: bytes, address) -> int:
        return self.sock.send(data) if self._connected else self.sock.sendto(data, address)

    def close(self) -> None:
        self.sock.close()


def _open_socket(address: tuple[str, int]) -> tuple[_Socket, tuple]:
    """A non-blocking UDP socket for ``address`` and the resolved target."""
    family, kind, proto, _, target = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_DGRAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
    except OSError:
        pass  # best effort; capped by net.core.wmem_max anyway
    sock.setblocking(False)
    loopback = is_loopback(target[0])
    if loopback:
        sock.connect(target)  # refusals come back as ECONNREFUSED
    return _Socket(sock, connected=loopback), target


def is_local(host: str) -> bool:
    """Whether datagrams to ``host`` (an IP address; a name is never looked up here) stay on this machine:
    loopback, or one of this machine's own addresses (a connected UDP socket's source is the target)."""
    if is_loopback(host):
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
        with socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # no packet is sent: the kernel only picks the route and the source
            return s.getsockname()[0] == host
    except (OSError, ValueError):
        return False


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address, or ``localhost``) is this machine's loopback."""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


_AGAIN, _BROKEN = "again", "broken"  # a datagram that did not go: the socket is fine / unusable


def pack(lines: list[bytes], max_datagram: int) -> tuple[list[tuple[bytes, int]], int]:
    """Group lines into ``(payload, n_lines)`` datagrams; also return how many were too long.

    >>> pack([b"aaaa", b"bb", b"c" * 9, b"dd"], 8)
    ([(b'aaaa\\nbb', 2), (b'ccccccccc', 1), (b'dd', 1)], 0)
    """
    datagrams, batch, size, too_long = [], [], 0, 0
    for line in lines:
        n = len(line)
        if n > MAX_UDP_PAYLOAD:
            too_long += 1
            continue
        if batch and size + 1 + n > max_datagram:
            datagrams.append((b"\n".join(batch), len(batch)))
            batch, size = [], 0
        if n > max_datagram:  # alone, in a datagram of its own
            datagrams.append((line, 1))
            continue
        size = size + 1 + n if batch else n
        batch.append(line)
    if batch:
        datagrams.append((b"\n".join(batch), len(batch)))
    return datagrams, too_long


class UdpSink:
    """Fire-and-forget UDP delivery of line-protocol lines (see the module docstring).

    ``sock`` injects a socket-like object (``sendto``, ``close``) used until
    the first reset/re-open, or a zero-argument callable returning one,
    used for every (re-)open. ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        address: tuple[str, int],
        max_datagram: Optional[int] = None,
        sock=None,
        reopen_every: float = 60.0,
        clock=time.monotonic,
        report=None,
    ):
        self.address = (str(address[0]), int(address[1]))
        self._auto = max_datagram is None  # from the address, once more when it is resolved
        self.max_datagram = (
            self._auto_size(self.address[0]) if self._auto else max(1, min(int(max_datagram), MAX_UDP_PAYLOAD))
        )
        self.reopen_every = reopen_every
        self.points_sent = 0
        self.datagrams_sent = 0
        self.points_dropped = 0
        self.errors = 0
        self.refused = 0  # datagrams refused: nothing listened at the address (loopback only)
        self._report = report
        self._once = Once()
        self._last_count = 0  # lines in the last datagram sent, lost if the next send is refused
        self._refusing = False
        self._refused_before = 0  # refused count when the current outage began
        self._clock = clock
        is_factory = isinstance(sock, type) or (callable(sock) and not hasattr(sock, "sendto"))
        self._factory = sock if is_factory else None
        self._sock = None if self._factory else sock
        self._target = self.address
        self._opened_at = clock()
        self._retry_at = 0.0
        self._failing = False
        self._lock = threading.Lock()

    def send(self, lines: list[bytes]) -> None:
        """Pack and send ``lines``; never raises, never blocks on the network."""
        self._send(lines, stop=False)

    def take(self, lines: list[bytes]) -> int:
        """Send ``lines`` in order until a datagram cannot go (socket buffer full, nothing listening, no
        route); how many went (or could never go: too long, counted). The rest stays the caller's, not
        counted here (an agent's outboxes keep it for the next sample)."""
        return self._send(lines, stop=True)

    def _send(self, lines: list[bytes], stop: bool) -> int:
        try:
            with self._lock:
                payload = b"\n".join(lines)
                if len(payload) <= self.max_datagram:  # every sample's case: one datagram (or none)
                    if lines and self._send_one(payload, len(lines)) is not None:
                        if stop:
                            return 0
                        self.points_dropped += len(lines)
                    return len(lines)
                fitted, index = self._fit(lines)
                datagrams, _ = pack(fitted, self.max_datagram)
                done = 0  # lines of ``fitted`` sent
                for i, (payload, count) in enumerate(datagrams):
                    status = self._send_one(payload, count)
                    if status is None:
                        done += count
                        continue
                    if stop:
                        return index[done]
                    self.points_dropped += count
                    if status == _BROKEN:  # the socket is unusable: the rest is dropped too
                        self.points_dropped += sum(c for _, c in datagrams[i + 1 :])
                        break
                    done += count
                return len(lines)
        except Exception:  # a sink must never take the sampler down
            logger.exception("UDP sink: unexpected error; %d line(s) dropped", len(lines))
            return 0 if stop else len(lines)

    def _fit(self, lines: list[bytes]) -> tuple[list[bytes], list[int]]:
        """``lines`` as they can go in a datagram: one longer than :data:`MAX_UDP_PAYLOAD` without its longest
        string fields (said once per measurement and fields), or, with nothing left to leave out, dropped and
        counted; and where each line kept came from (``index[k]``: the position in ``lines`` of the k-th kept,
        ``index[len(kept)]``: ``len(lines)``)."""
        if max(map(len, lines), default=0) <= MAX_UDP_PAYLOAD:
            return lines, range(len(lines) + 1)
        fitted, index = [], []
        for i, line in enumerate(lines):
            if len(line) > MAX_UDP_PAYLOAD:
                line = self._shortened(line)
                if line is None:
                    self.points_dropped += 1
                    continue
            fitted.append(line)
            index.append(i)
        return fitted, index + [len(lines)]

    def _shortened(self, line: bytes) -> bytes | None:
        try:
            point = lineparse.parse(line)
        except ValueError:
            point = None
        cut, fields = [], dict(point.fields) if point is not None else {}
        strings = sorted((f for f, v in fields.items() if isinstance(v, str)), key=lambda f: -len(fields[f]))
        shorter = None
        for name in strings:  # the longest first: usually one (a task list, a custom text)
            del fields[name]
            cut.append(name)
            shorter = lineprotocol.encode(point._replace(fields=fields)) if fields else None
            if shorter is None or len(shorter) <= MAX_UDP_PAYLOAD:
                break
        measurement = point.measurement if point is not None else line[:40].decode("utf-8", "replace")
        if shorter is not None and len(shorter) <= MAX_UDP_PAYLOAD:
            what = f"sent without its field(s) {cut}"
        else:
            shorter, what = None, "dropped (no field to leave out)"
        message = (
            f"a {measurement} line of {len(line)} bytes does not fit a UDP datagram ({MAX_UDP_PAYLOAD} bytes): "
            f"{what}; the sample's other lines are sent (said once)"
        )
        if self._once((measurement, tuple(cut))):
            logger.warning("UDP sink: %s", message)
            if self._report is not None:
                self._report("udp-long-line", message)
        return shorter

    def _send_one(self, payload: bytes, count: int) -> str | None:
        """Send one datagram; None when it went, :data:`_AGAIN` when it did not (the socket is fine: buffer
        full, refused), :data:`_BROKEN` when the socket is unusable."""
        sock = self._sock
        if sock is None or self._clock() - self._opened_at >= self.reopen_every:
            sock = self._reopen()
        if sock is None:
            return _BROKEN
        try:
            try:
                sock.sendto(payload, self._target)
            except ConnectionRefusedError:  # the previous datagram was refused; this one was not sent
                self._refused()
                sock.sendto(payload, self._target)
            else:
                if self._refusing:  # the previous datagram was not refused: a listener is back
                    self._listening()
        except (BlockingIOError, ConnectionRefusedError):  # send buffer full, or refused again
            return _AGAIN
        except OSError as e:
            self._fail(e)
            return _BROKEN
        self.datagrams_sent += 1
        self.points_sent += count
        self._last_count = count
        if self._failing:
            logger.info("UDP sink: sending to %s:%d again", *self.address)
            self._failing = False
        return None

    def _refused(self) -> None:
        self.refused += 1
        self.points_sent -= self._last_count
        self.points_dropped += self._last_count
        self._last_count = 0
        if not self._refusing:
            self._refusing = True
            self._refused_before = self.refused - 1
            message = (
                f"nothing listens at the Telegraf address {self.address[0]}:{self.address[1]} (datagrams "
                "refused); samples are dropped until a listener starts"
            )
            logger.warning("UDP sink: %s", message)
            if self._report is not None:
                self._report("udp-refused", message)

    def _listening(self) -> None:
        self._refusing = False
        message = (
            f"a listener is back at the Telegraf address {self.address[0]}:{self.address[1]}; "
            f"{self.refused - self._refused_before} datagram(s) were refused meanwhile"
        )
        logger.info("UDP sink: %s", message)
        if self._report is not None:
            self._report("udp-listening", message)

    def _reopen(self):
        """The socket opened again (it is ``reopen_every`` s old, or none is open): None while a failure's
        :data:`_RETRY_OPEN_AFTER` has not passed, or if opening fails."""
        now = self._clock()
        if now < self._retry_at:
            return None
        self._close_socket()
        try:
            if self._factory is not None:
                self._sock, self._target = self._factory(), self.address
            else:
                self._sock, self._target = _open_socket(self.address)
                if self._auto:
                    self.max_datagram = self._auto_size(self._target[0])
        except OSError as e:
            self._fail(e)
            return None
        self._opened_at = now
        return self._sock

    @staticmethod
    def _auto_size(host: str) -> int:
        return MAX_UDP_PAYLOAD if is_local(host) else ETHERNET_PAYLOAD

    def _fail(self, error: OSError) -> None:
        self.errors += 1
        self._close_socket()
        self._retry_at = self._clock() + _RETRY_OPEN_AFTER
        if not self._failing:  # once per run of failures, not per call
            logger.warning(
                "UDP sink: cannot send to %s:%d (%s); dropping lines until it works again",
                self.address[0],
                self.address[1],
                error,
            )
            self._failing = True

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def flush(self, drain: float = 0.0) -> None:
        """Nothing to do: UDP keeps no buffer, each send went out."""

    def close(self) -> None:
        """Close the socket (UDP keeps no buffer to flush)."""
        with self._lock:
            self._close_socket()
            self._retry_at = float("inf")

    def counters(self) -> list[dict]:
        return [
            {
                "kind": "udp",
                "points_sent": self.points_sent,
                "datagrams_sent": self.datagrams_sent,
                "points_dropped": self.points_dropped,
                "refused": self.refused,
                "errors": self.errors,
            }
        ]

    def delivery(self) -> list[dict]:
        sent, dropped = self.points_sent, self.points_dropped
        return [{"sink": "udp", "points_sent": sent, "points_dropped": dropped, "errors": self.errors}]
