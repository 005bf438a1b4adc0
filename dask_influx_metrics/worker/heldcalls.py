"""Short system calls made without releasing the GIL: ``pread`` of a ``/proc`` file, a UDP ``send``,
a ``write`` to a non-blocking pipe.

Python releases the GIL around every system call (``os.pread``,
``socket.sendto``). For the sampler thread that is the expensive part: while
tasks hold the GIL, getting it back after a 10-30 us call costs up to a switch
interval (``sys.getswitchinterval()``, 5 ms), and more when several task
threads take turns first, so a sample with ten such calls took 50 ms or more
under GIL-holding tasks. These calls never block (a ``/proc`` file is
generated in the kernel; the UDP socket is non-blocking and the send is
``MSG_DONTWAIT``), so here they go to libc through :class:`ctypes.PyDLL`,
which keeps the GIL for the call. Where libc cannot be loaded that way,
:data:`HELD` is False and the ordinary Python calls are used.

Example
-------
>>> import os
>>> fd = os.open("/proc/self/cmdline", os.O_RDONLY)
>>> Reader(4096).pread(fd) == os.pread(fd, 4096, 0)
True
>>> os.close(fd)
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys

MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


def _libc():
    """libc's ``pread``, ``send``, ``sendto`` and ``write``, called with the GIL held, or None."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)  # this process's symbols, libc's among them (no lookup)
        calls = libc.pread, libc.send, libc.sendto, libc.write
    except (OSError, AttributeError):
        return None
    size, ssize, buf = ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_char_p
    calls[0].argtypes, calls[0].restype = (ctypes.c_int, ctypes.c_void_p, size, ctypes.c_long), ssize
    calls[1].argtypes, calls[1].restype = (ctypes.c_int, buf, size, ctypes.c_int), ssize
    calls[2].argtypes, calls[2].restype = (ctypes.c_int, buf, size, ctypes.c_int, buf, ctypes.c_uint), ssize
    calls[3].argtypes, calls[3].restype = (ctypes.c_int, buf, size), ssize
    return calls


_CALLS = _libc() if os.name == "posix" else None
HELD = _CALLS is not None


def _error() -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))  # the errno's subclass: BlockingIOError, ConnectionRefusedError...


class Reader:
    """Reads of up to ``size`` bytes at offset 0 of ``fd`` into one reused buffer."""

    def __init__(self, size: int):
        self.size = size
        self._buffer = ctypes.create_string_buffer(size)

    def pread(self, fd: int) -> bytes:
        if not HELD:
            return os.pread(fd, self.size, 0)
        n = _CALLS[0](fd, self._buffer, self.size, 0)
        if n < 0:
            raise _error()
        return ctypes.string_at(self._buffer, n)


def write(fd: int, data: bytes) -> int:
    """``os.write`` keeping the GIL; for a non-blocking ``fd`` only (a pipe: ``BlockingIOError`` when full)."""
    if not HELD:
        return os.write(fd, data)
    n = _CALLS[3](fd, data, len(data))
    if n < 0:
        raise _error()
    return n


def sockaddr(sock: socket.socket, address: tuple) -> bytes | None:
    """``struct sockaddr`` bytes of ``address`` for ``sock``'s family (IPv4/IPv6), or None."""
    host, port, native = address[0], address[1], sys.byteorder
    family = int(sock.family).to_bytes(2, native) + port.to_bytes(2, "big")
    if sock.family == socket.AF_INET:
        return family + socket.inet_pton(socket.AF_INET, host) + bytes(8)
    if sock.family == socket.AF_INET6:
        flow, scope = (address[2], address[3]) if len(address) >= 4 else (0, 0)
        return (family + flow.to_bytes(4, "big") + socket.inet_pton(socket.AF_INET6, host.split("%")[0])
                + scope.to_bytes(4, native))
    return None


class HeldSocket:
    """A non-blocking datagram socket whose ``sendto`` keeps the GIL (the ``socket`` API subset the UDP
    sink uses: ``sendto``, ``close``); a connected socket sends with ``send``.

    ``held=False``: Python's own calls, which release the GIL, for a process where no other thread
    wants it (the sidecar): ~1.8 us cheaper a send than the call through ctypes.
    """

    def __init__(self, sock: socket.socket, target: tuple, connected: bool, held: bool = True):
        self.sock, self._fd, self._connected = sock, sock.fileno(), connected
        self._address = None if connected else sockaddr(sock, target)
        self._plain = not (held and HELD) or (not connected and self._address is None)

    def sendto(self, data: bytes, address) -> int:
        if self._plain:
            return self.sock.send(data) if self._connected else self.sock.sendto(data, address)
        if self._address is None:
            n = _CALLS[1](self._fd, data, len(data), MSG_DONTWAIT)
        else:
            n = _CALLS[2](self._fd, data, len(data), MSG_DONTWAIT, self._address, len(self._address))
        if n < 0:
            raise _error()
        return n

    def close(self) -> None:
        self.sock.close()
