"""HTTP sink: POST line protocol to ``{url}/write`` from a background thread.

One endpoint for every version: InfluxDB 1.x; 2.x through its v1
compatibility API (a DBRP mapping for ``database``/``retention_policy``); and
3.x, which serves ``/write`` natively (``retention_policy``, unless
``autogen``, names a database ``<database>/<rp>`` there). ``precision=ns`` is
valid on all three. ``token`` sends ``Authorization: Token <token>``, which
2.x and 3.x accept on ``/write`` (and 1.8 as ``user:password``); otherwise
``username``/``password`` (or a ``http://user:password@host`` URL) go as HTTP
basic auth (3.x reads the password as its token). Credentials travel only in
that header; ``url`` and every log line show the address without them.
InfluxDB 3 answers 400 to lines that put a tag and a field of the same name in
one table; those go to the fallback like any refused batch.

``send`` only appends to a bounded in-memory queue (``max_pending`` lines,
default ``2 * batch_size``: about 3 MB at 5000 lines of ~300 bytes) and returns; a thread posts batches of up to
``batch_size`` lines when a batch is full or ``flush_interval`` seconds after
its first line. Lines the server did not take go to ``fallback`` (a sink,
normally a :class:`~.spool.SpoolSink`) so nothing is lost: after a connection
error or 5xx, after a 4xx (bad data or auth; logged with the server's
message), and when the queue is full. InfluxDB 1.x answers 400 to a
*partial* write too; the whole batch then goes to the fallback, and
replaying it later rewrites the accepted points, which InfluxDB treats as an
idempotent overwrite. After a connection error or 5xx the sink backs off
(1 s, then 2 s, then :data:`MAX_BACKOFF` = 3 s between tries): batches go
straight to the fallback until the next try, so a dead server costs neither a
request per batch nor memory, and writing resumes at most ~4 s (back-off +
``flush_interval``) after the server returns. An outage is logged once, as a
warning, however long it lasts; its end once, as info.

Example (needs a server)::

    sink = HttpSink("http://127.0.0.1:8086", "dask_metrics", fallback=SpoolSink("/tmp/x"))
    sink.send([b"m v=1i 1"])
    sink.close()          # flushes (bounded wait), stops the thread, closes the fallback
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

import requests

from .. import credentials

logger = logging.getLogger(__name__)

MAX_BACKOFF = 3.0  # s between tries while the server is down; bounds the recovery time


def write_url(url: str) -> str:
    """The ``/write`` endpoint under a base URL.

    >>> write_url("http://influxdb:8086/")
    'http://influxdb:8086/write'
    """
    return url.rstrip("/") + "/write"


class HttpSink:
    """Batched, non-blocking writes to InfluxDB's ``/write`` (see the module docstring)."""

    def __init__(self, url: str, database: str, retention_policy: Optional[str] = None,
                 username: Optional[str] = None, password: Optional[str] = None,
                 token: Optional[str] = None, batch_size: int = 5000, timeout: float = 5.0,
                 flush_interval: float = 1.0, fallback=None, max_pending: Optional[int] = None,
                 session: Optional[requests.Session] = None):
        url, username, password = credentials.take(url, username, password)  # user:password@ out of the URL
        self.url = write_url(url)
        self.params = {"db": database, "precision": "ns"}
        if retention_policy:
            self.params["rp"] = retention_policy
        self.headers = {"Content-Type": "text/plain; charset=utf-8"}
        self.auth = None
        if token:
            self.headers["Authorization"] = f"Token {token}"
        elif username:
            self.auth = (username, password or "")  # requests sends it as Authorization: Basic
        self.batch_size = max(1, int(batch_size))
        self.timeout = float(timeout)
        self.flush_interval = float(flush_interval)
        self.max_pending = int(max_pending or 2 * self.batch_size)
        self.fallback = fallback
        self.points_written = 0
        self.points_failed = 0
        self._session = session or requests.Session()
        self._buffer: list[bytes] = []
        self._first_at = 0.0
        self._stopping = False
        self._closed = False
        self._failure: Optional[str] = None  # the kind of failure last logged
        self.max_backoff = MAX_BACKOFF
        self._busy = False  # a batch is being posted
        self._draining = 0  # drain() callers waiting: post without waiting for a full batch
        self._backoff = 0.0
        self._down_until = 0.0
        self._cond = threading.Condition()
        self._stats_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="influx-http-sink", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Lines queued and not yet posted."""
        return len(self._buffer)

    def send(self, lines: list[bytes]) -> None:
        """Queue ``lines`` for the writer thread; never blocks, never raises."""
        if not lines:
            return
        try:
            with self._cond:
                overflow = self._stopping or len(self._buffer) + len(lines) > self.max_pending
                if not overflow:
                    if not self._buffer:
                        self._first_at = time.monotonic()
                    self._buffer.extend(lines)
                    self._cond.notify()
            if overflow:
                why = "queue full" if not self._stopping else "sink closed"
                self._give_up(list(lines), why, why)
        except Exception:
            logger.exception("HTTP sink: unexpected error in send")

    def _next_batch(self) -> tuple[list[bytes], bool]:
        with self._cond:
            while not self._buffer and not self._stopping:
                self._cond.wait()
            while not self._stopping and not self._draining and len(self._buffer) < self.batch_size:
                remaining = self._first_at + self.flush_interval - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch = self._buffer[:self.batch_size]
            del self._buffer[:len(batch)]
            if self._buffer:
                self._first_at = time.monotonic()
            self._busy = bool(batch)
            return batch, self._stopping and not self._buffer

    def _run(self) -> None:
        while True:
            batch, done = self._next_batch()
            if batch and time.monotonic() < self._down_until:  # the same outage: not a new failure
                self._give_up(batch, f"{self.url} is down; retrying in {self._down_until - time.monotonic():.1f} s",
                              self._failure)
            elif batch:
                try:
                    self._post(batch)
                except Exception as e:  # never let the thread die with lines in hand
                    self._give_up(batch, f"unexpected error: {e!r}", "unexpected")
            with self._cond:
                self._busy = False
                self._cond.notify_all()
            if done:
                return

    def drain(self, timeout: float) -> bool:
        """Post what is queued now and wait at most ``timeout`` s until it was handled (written or
        given up); True if it was. ``points_written``/``points_failed`` then say how it went."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._draining += 1
            self._cond.notify_all()
            try:
                while (self._buffer or self._busy) and self._thread.is_alive():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                return not self._buffer
            finally:
                self._draining -= 1

    def _post(self, batch: list[bytes]) -> None:
        try:
            r = self._session.post(self.url, params=self.params, data=b"\n".join(batch),
                                   headers=self.headers, auth=self.auth, timeout=self.timeout)
        except requests.RequestException as e:
            self._back_off()
            self._give_up(batch, f"cannot reach {self.url}: {e}", "unreachable")
            return
        if r.status_code < 300:
            self._backoff = 0.0
            with self._stats_lock:
                self.points_written += len(batch)
            if self._failure:
                logger.info("HTTP sink: writing to %s again", self.url)
                self._failure = None
            return
        if r.status_code >= 500:
            self._back_off()
        kind = "rejected (bad data or auth)" if r.status_code < 500 else "server error"
        self._give_up(batch, f"HTTP {r.status_code} {kind} from {self.url}: {r.text.strip()[:500]}", f"HTTP {r.status_code}")

    def _back_off(self) -> None:
        """After a failed post, hand batches straight to the fallback for a while
        (1 s, doubling to ``max_backoff``) instead of building and posting each one."""
        self._backoff = min(self.max_backoff, max(1.0, self._backoff * 2))
        self._down_until = time.monotonic() + self._backoff

    def _give_up(self, lines: list[bytes], why: str, kind: Optional[str]) -> None:
        """Count ``lines`` as not written and hand them to the fallback; a new ``kind`` of failure is a warning."""
        where = "handed to the fallback" if self.fallback is not None else "LOST (no fallback)"
        with self._stats_lock:
            self.points_failed += len(lines)
            new = kind != self._failure
            self._failure = kind
        (logger.warning if new else logger.debug)("HTTP sink: %s; %d line(s) %s", why, len(lines), where)
        if self.fallback is not None:
            try:
                self.fallback.send(lines)
            except Exception:
                logger.exception("HTTP sink: fallback failed; %d line(s) lost", len(lines))

    def close(self, wait: Optional[float] = None) -> None:
        """Flush queued lines (waiting at most ``wait`` s, default ``timeout + 1``), stop, close the fallback.

        Lines still queued when the wait runs out go to the fallback.
        """
        if self._closed:
            return
        self._closed = True
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(self.timeout + 1.0 if wait is None else wait)
        with self._cond:
            left, self._buffer = self._buffer, []
        if left:
            self._give_up(left, "close() timed out", "close() timed out")
        if not self._thread.is_alive():
            self._session.close()
        if self.fallback is not None:
            self.fallback.close()
