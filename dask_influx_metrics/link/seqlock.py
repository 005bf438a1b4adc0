"""A buffer one process writes and any read, over a shared mapping of a file: a seqlock with a CRC.

The sequence number at offset 0 is odd while the writer writes; a reader retries on an odd or changed
number or a CRC mismatch, so it never returns a torn payload. The file's every page is reserved when it is
created (``posix_fallocate``): on a full tmpfs the first touch of a mapped page that is not raises SIGBUS in
whoever touches it, reader or writer, and a monitor must never kill the process it watches. :mod:`.snapshot`
keeps a worker's task snapshot and the agent's beat in them.

>>> buf = SnapshotBuffer.create(4096); buf.write(b"hello"); buf.read(), buf.version()
(b'hello', 2)
>>> buf.close()
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import time
import zlib

_SEQ = struct.Struct("<Q")  # at offset 0: even = stable, odd = being written
_BODY = struct.Struct("<II")  # at offset 8: payload length, crc32
HEADER = _SEQ.size + _BODY.size  # the payload starts here


class SnapshotBuffer:
    """One writer, any readers, over a shared mapping of file descriptor ``fd`` (seqlock + CRC)."""

    def __init__(self, fd: int, size: int, writable: bool):
        self.fd, self.size, self.capacity = fd, size, size - HEADER
        self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        self._seq = _SEQ.unpack_from(self._mm, 0)[0]
        self._seq += self._seq % 2  # a buffer written in place after its writer died mid-write: start even

    @classmethod
    def create(cls, size: int, path: str | None = None) -> "SnapshotBuffer":
        """A new zeroed buffer: the file ``path`` (created 0600, replaced if there), else anonymous memory."""
        if path is None:
            with tempfile.TemporaryFile() as f:
                fd, tmp = os.dup(f.fileno()), None
        else:
            tmp = f"{path}.{os.getpid()}.new"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # every page reserved: a full file system is ENOSPC here, not a fault later
            if tmp is not None:
                os.replace(tmp, path)  # readers never see a file shorter than ``size``
        except BaseException:
            os.close(fd)
            if tmp is not None:
                os.unlink(tmp)
            raise
        return cls(fd, size, writable=True)

    @classmethod
    def open(cls, path: str, size: int) -> "SnapshotBuffer":
        """Another process's buffer, read-only."""
        fd = os.open(path, os.O_RDONLY)
        try:
            return cls(fd, size, writable=False)
        except BaseException:
            os.close(fd)
            raise

    def write(self, data: bytes) -> None:
        if len(data) > self.capacity:
            raise ValueError(f"{len(data)} bytes do not fit in {self.capacity}")
        mm, seq = self._mm, self._seq + 1
        _SEQ.pack_into(mm, 0, seq)  # odd: readers retry
        mm[HEADER : HEADER + len(data)] = data
        _BODY.pack_into(mm, _SEQ.size, len(data), zlib.crc32(data))
        _SEQ.pack_into(mm, 0, seq + 1)
        self._seq = seq + 1

    def raw(self) -> mmap.mmap:
        """The mapping itself, for a reader that needs one fixed-size field at a glance."""
        return self._mm

    def version(self) -> int:
        """The sequence number now (even: stable; it changes with every write): a few tens of
        nanoseconds, to tell whether :meth:`read` could return anything new."""
        return _SEQ.unpack_from(self._mm, 0)[0]

    def read(self, tries: int = 30) -> bytes | None:
        """The latest whole payload; None if nothing was written yet or no stable copy in ``tries``
        (a few ms at most: a sampler keeps its previous snapshot rather than wait on the worker)."""
        mm = self._mm
        for i in range(tries):
            seq = _SEQ.unpack_from(mm, 0)[0]
            length, crc = _BODY.unpack_from(mm, _SEQ.size)
            if seq % 2 == 0 and length <= self.capacity:
                data = mm[HEADER : HEADER + length]
                if _SEQ.unpack_from(mm, 0)[0] == seq and zlib.crc32(data) == crc:
                    return data if seq else None
            time.sleep(0 if i < 10 else 1e-4)
        return None

    def close(self) -> None:
        """Unmap and close the descriptor; safe to call twice."""
        if not self._mm.closed:
            self._mm.close()
            os.close(self.fd)
