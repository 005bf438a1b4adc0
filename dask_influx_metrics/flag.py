"""A flag one thread waits on: the pauses of a worker's own sampler and the agent's main thread (:class:`Flag`),
and of a worker's watcher, which waits on the agent's exit too (:class:`PollFlag`).

:class:`threading.Event` builds a lock and takes a Condition's at each ``wait``; a bare lock waited on with a
timeout does neither. Thread CPU per 100 ms wait and wake on this project's VM: Event ~130 us, Flag ~100 us,
``time.sleep`` ~70 us (which the agent's sampler uses: its wakes are sampled on the waking thread).

>>> f = Flag(); f.wait(0.0), f.set(), f.set(), f.wait(0.0), f.wait(0.0), f.clear(), f.wait(0.0)
(False, None, None, True, True, None, False)
"""

from __future__ import annotations

import os
import select
import threading


class Flag:
    """A :class:`threading.Event` for one waiting thread: a lock held while the flag is down."""

    def __init__(self):
        self._down = threading.Lock()
        self._down.acquire()

    def set(self) -> None:
        try:
            self._down.release()
        except RuntimeError:  # up already
            pass

    def clear(self) -> None:
        self._down.acquire(blocking=False)

    def is_set(self) -> bool:
        return not self._down.locked()

    def wait(self, timeout: float) -> bool:
        """Whether the flag is up (within ``timeout`` s); it stays up until :meth:`clear`."""
        if not self._down.acquire(timeout=timeout):
            return False
        self.set()
        return True


class PollFlag:
    """A :class:`Flag` on a pipe, for a thread that waits on it and on other descriptors at once (a process's
    pidfd: readable when it exits). Setting it while it is down is a write (a lock's release to a waiting
    thread is a futex call).

    >>> f = PollFlag(); f.wait(0.0), f.set(), f.set(), f.wait(0.0), f.is_set(), f.clear(), f.wait(0.0), f.is_set()
    ([], None, None, [], True, None, [], False)
    """

    def __init__(self):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._up = False
        self._poll = select.poll()
        self._poll.register(self._r, select.POLLIN)

    def set(self) -> None:
        if not self._up:
            self._up = True
            os.write(self._w, b"x")

    def clear(self) -> None:
        if self._up:
            self._up = False  # before the read: a set() from now on is seen (the flag, or its byte)
            try:
                os.read(self._r, 64)
            except BlockingIOError:
                pass

    def is_set(self) -> bool:
        return self._up

    def wait(self, timeout: float, fds=()) -> list[int]:
        """Wait up to ``timeout`` s for the flag or one of ``fds`` to be readable; returns those of ``fds`` that
        are (:meth:`is_set` says whether the flag is up)."""
        if self._up:
            return []
        for fd in fds:
            self._poll.register(fd, select.POLLIN)
        try:
            return [fd for fd, _ in self._poll.poll(timeout * 1000) if fd != self._r]
        finally:
            for fd in fds:
                self._poll.unregister(fd)

    def __del__(self):  # not before: a set() that comes late must not write into a descriptor reused meanwhile
        os.close(self._r)
        os.close(self._w)
