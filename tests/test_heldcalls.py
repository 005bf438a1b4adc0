"""System calls with the GIL held: the same bytes and errors as Python's own calls, real sockets on loopback."""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time

import pytest

from dask_influx_metrics.worker import heldcalls
from dask_influx_metrics.worker.heldcalls import HeldSocket, Reader, sockaddr


def test_libc_is_used_on_linux():
    assert heldcalls.HELD or not sys.platform.startswith("linux")


@pytest.mark.parametrize("path", ["/proc/self/cmdline", "/proc/meminfo", "/proc/self/stat"])
def test_pread_reads_what_os_pread_reads(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        ours, theirs = Reader(65536).pread(fd), os.pread(fd, 65536, 0)
        assert len(ours) > 0 and ours.split(b"\n")[0].split(b" ")[:2] == theirs.split(b"\n")[0].split(b" ")[:2]
        assert Reader(8).pread(fd) == os.pread(fd, 8, 0)  # at most the buffer's size
    finally:
        os.close(fd)


def test_pread_errors_are_oserrors_with_their_errno():
    with pytest.raises(OSError) as info:
        Reader(16).pread(-1)
    assert info.value.errno == errno.EBADF


def receive(sock) -> bytes:
    sock.settimeout(5)
    return sock.recv(65536)


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
@pytest.mark.parametrize("connected", [True, False])
@pytest.mark.parametrize("held", [True, False])
def test_datagrams_arrive_connected_or_not(family, host, connected, held):
    try:
        rx = socket.socket(family, socket.SOCK_DGRAM)
        rx.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} here")
    tx = socket.socket(family, socket.SOCK_DGRAM)
    tx.setblocking(False)
    target = rx.getsockname()
    if connected:
        tx.connect(target)
    held = HeldSocket(tx, target, connected=connected, held=held)
    try:
        for payload in (b"m v=1i 1", b"x" * 9000):
            assert held.sendto(payload, target) == len(payload)
            assert receive(rx) == payload
    finally:
        held.close()
        rx.close()
    assert tx.fileno() == -1, "close() closes the socket"


def test_sockaddr_matches_what_the_kernel_reports():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    try:
        raw = sockaddr(rx, rx.getsockname())
        assert len(raw) == 16 and raw[2:4] == rx.getsockname()[1].to_bytes(2, "big") and raw[4:8] == b"\x7f\0\0\1"
    finally:
        rx.close()


@pytest.mark.parametrize("held", [True, False])
def test_a_refusal_is_a_connection_refused_error(held):
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    target = probe.getsockname()
    probe.close()  # nothing listens there now
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setblocking(False)
    tx.connect(target)
    held = HeldSocket(tx, target, connected=True, held=held)
    try:
        held.sendto(b"a", target)
        deadline = time.monotonic() + 5
        with pytest.raises(ConnectionRefusedError):  # the kernel reports the refusal on a later send
            while time.monotonic() < deadline:
                held.sendto(b"a", target)
    finally:
        held.close()


def switches_during(read, rounds: int = 20) -> int:
    """In how many of ``rounds`` rounds of 5 ``read()`` calls a busy thread ran in between (the GIL
    changed hands). Each round starts as a sampler's does: the GIL taken back from two busy threads."""
    stop, ticks = threading.Event(), [0]

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    threads = [threading.Thread(target=spin) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        inside = 0
        for _ in range(rounds):
            time.sleep(0.002)  # the busy threads hold the GIL; getting it back is a forced switch
            before = ticks[0]
            for _ in range(5):
                read()
            inside += ticks[0] != before
        return inside
    finally:
        stop.set()
        for t in threads:
            t.join()


@pytest.mark.skipif(not heldcalls.HELD, reason="no libc to call with the GIL held")
def test_a_held_read_does_not_hand_the_gil_to_a_busy_thread():
    """os.pread releases the GIL and a just-displaced busy thread often takes it (here 5-6 rounds
    of 20), so the reader waits up to a switch interval (5 ms) to get it back; a held read keeps it."""
    fd = os.open("/proc/meminfo", os.O_RDONLY)
    reader = Reader(65536)
    try:
        held = switches_during(lambda: reader.pread(fd))
        plain = switches_during(lambda: os.pread(fd, 65536, 0))  # for the message only: it varies
    finally:
        os.close(fd)
    assert held <= 1, f"the GIL changed hands in {held} rounds of held reads ({plain} with os.pread)"
