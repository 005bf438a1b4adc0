"""A lossy UDP relay on loopback: forwards each datagram to ``target`` or, with probability ``drop``, drops it
(seeded), as a Telegraf whose read buffer is full would. ``address`` is where to send; ``close()`` stops it."""

from __future__ import annotations

import random
import socket
import threading


class LossyRelay:
    def __init__(self, target: tuple[str, int], drop: float = 0.3, seed: int = 49):
        self.target, self.drop = target, drop
        self._random = random.Random(seed)
        self._in = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._in.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._in.bind(("127.0.0.1", 0))
        self._in.settimeout(0.2)
        self._out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.address = self._in.getsockname()
        self.forwarded = self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lossy-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._in.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if self._random.random() < self.drop:
                self.dropped += 1
            else:
                self.forwarded += 1
                self._out.sendto(data, self.target)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._in.close()
        self._out.close()
