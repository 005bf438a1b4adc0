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

A monitor's HTTP sink is a :class:`~.journal.JournaledHttpSink`: every line on disk (``undelivered/``)
before it is posted, posted from there, what an outage leaves sent by itself when the server answers again.
This class, with its queue in memory, serves ``replay`` and an HTTP sink beside a spool sink.

A write answered ``404 database not found`` (a fresh InfluxDB 1.x) creates the
database once and is posted again (:mod:`.createdb`; ``create_database=False``: never).

``send`` only appends to a bounded in-memory queue (``max_pending`` lines,
default ``2 * batch_size``: about 3 MB at 5000 lines of ~300 bytes) and returns; a thread posts batches of up to
``batch_size`` lines when a batch is full or ``flush_interval`` seconds after
its first line. Lines the server did not take go to ``fallback`` (a sink,
normally a :class:`~.spool.SpoolSink` in ``undelivered/``) so nothing is lost:
after a connection error, a 5xx or a 4xx that is not about the data (auth, no
such database), and when the queue is full; they count in ``points_failed``.

What the server refuses as data (400, 422; 413 for a single line) is never
counted as written: those lines go to ``refused`` (a folder, normally
``<worker>/refused/``), with the server's reason appended to
``refused/reasons.txt``, and count in ``points_refused``. InfluxDB 1.x
writes the rest of such a batch and answers 400 ``partial write: ...
dropped=N``; it names each line it could not parse, and for a field type
conflict the measurement and field, so only the lines it refused are kept when
they can be told apart, else the whole batch (replaying it rewrites the
accepted points: an idempotent overwrite in InfluxDB). Replaying another session's copy is an
explicit call (:func:`~dask_influx_metrics.sinks.replay.replay_folders`). A 413 (a proxy's body limit) halves the
batch and the batch size, down to one line, said once and counted in
``batches_split``. After a connection error or 5xx the sink backs off
(1 s, then 2 s, then :data:`MAX_BACKOFF` = 3 s between tries): batches go
straight to the fallback until the next try, so a dead server costs neither a
request per batch nor memory, and writing resumes at most ~4 s (back-off +
``flush_interval``) after the server returns. An outage is logged once, as a
warning, however long it lasts; its end once, as info.

Example (needs a server)::

    sink = HttpSink("http://127.0.0.1:8086", "dask_metrics", HttpOptions(batch_size=1000), fallback=SpoolSink("/tmp/x"))
    sink.send([b"m v=1i 1"])
    sink.close()          # flushes (bounded wait), stops the thread, closes the fallback
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Optional

import requests

from .. import credentials
from .base import Sink
from .createdb import create_database
from .refused import RefusedFolder, refused_lines

logger = logging.getLogger(__name__)

MAX_BACKOFF = 3.0  # s between tries while the server is down; bounds the recovery time
REFUSED_STATUS = (400, 413, 422)  # the server refuses the data itself: retrying the same lines cannot help


def write_url(url: str) -> str:
    """The ``/write`` endpoint under a base URL.

    >>> write_url("http://influxdb:8086/")
    'http://influxdb:8086/write'
    """
    return url.rstrip("/") + "/write"


@dataclasses.dataclass(frozen=True)
class HttpOptions:
    """How an :class:`HttpSink` writes: credentials, batches, the queue's bound (see the module docstring).
    Its ``repr`` never shows the password or token."""

    retention_policy: Optional[str] = None
    username: Optional[str] = None
    password: Optional[str] = dataclasses.field(default=None, repr=False)
    token: Optional[str] = dataclasses.field(default=None, repr=False)
    batch_size: int = 5000
    timeout: float = 5.0
    flush_interval: float = 1.0
    max_pending: Optional[int] = None
    create_database: bool = True


class HttpSink:
    """Batched, non-blocking writes to InfluxDB's ``/write`` (see the module docstring).

    ``fallback``: the sink for lines the server did not take (:class:`~.journal.JournaledHttpSink` has none:
    its lines are on disk before they are posted); ``refused``: the folder for lines it refused as data;
    ``session``: the ``requests.Session`` to post with (tests inject one).
    """

    def __init__(
        self,
        url: str,
        database: str,
        options: HttpOptions = HttpOptions(),
        *,
        fallback: Optional[Sink] = None,
        refused=None,
        session: Optional[requests.Session] = None,
    ):
        url, username, password = credentials.take(url, options.username, options.password)  # user:password@ out
        self.url = write_url(url)
        self.query_url = url.rstrip("/") + "/query"  # CREATE DATABASE, once, when a write finds none
        self.create_database = options.create_database
        self.params = {"db": database, "precision": "ns"}
        if options.retention_policy:
            self.params["rp"] = options.retention_policy
        self.headers = {"Content-Type": "text/plain; charset=utf-8"}
        self.auth = None
        if options.token:
            self.headers["Authorization"] = f"Token {options.token}"
        elif username:
            self.auth = (username, password or "")  # requests sends it as Authorization: Basic
        self.batch_size = max(1, int(options.batch_size))
        self.timeout = float(options.timeout)
        self.flush_interval = float(options.flush_interval)
        self.max_pending = int(options.max_pending or 2 * self.batch_size)
        self.fallback = fallback
        self.refused_dir = None if refused is None else os.fspath(refused)
        self._refused = None if refused is None else RefusedFolder(refused)
        self.points_written = 0
        self.points_failed = 0  # not written: handed to the fallback (or lost without one)
        self.points_refused = 0  # refused by the server as data: kept under ``refused`` (or the fallback)
        self.batches_split = 0  # halved after an HTTP 413
        self.errors = 0  # failed requests: unreachable, 5xx, 4xx not about the data
        self.points_lost = 0  # neither posted nor kept anywhere (a journal's disk and the queue full)
        self._splitting = False
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
        self._why, self._kind = "", None  # what the last failed post met, and its kind
        self._thread = threading.Thread(target=self._run, name="influx-http-sink", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Lines queued and not yet posted."""
        return len(self._buffer)

    def take(self, lines: list[bytes]) -> int:
        """:meth:`send`: every line is queued (posted, or handed to the fallback)."""
        self.send(lines)
        return len(lines)

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
            batch = self._buffer[: self.batch_size]
            del self._buffer[: len(batch)]
            if self._buffer:
                self._first_at = time.monotonic()
            self._busy = bool(batch)
            return batch, self._stopping and not self._buffer

    def _run(self) -> None:
        while True:
            batch, done = self._next_batch()
            if batch and time.monotonic() < self._down_until:  # the same outage: not a new failure
                self._give_up(
                    batch, f"{self.url} is down; retrying in {self._down_until - time.monotonic():.1f} s", self._failure
                )
            elif batch:
                try:
                    failed = self._post(batch)
                except Exception as e:  # never let the thread die with lines in hand
                    failed, self._why, self._kind = batch, f"unexpected error: {e!r}", "unexpected"
                if failed:
                    self._give_up(failed, self._why, self._kind)
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
                while (self.pending or self._busy) and self._thread.is_alive():
                    left = deadline - time.monotonic()
                    if left <= 0 or self._waiting():
                        return False
                    self._cond.wait(left)
                return not self.pending
            finally:
                self._draining -= 1

    def _waiting(self) -> bool:
        """Whether the lines wait for the server on disk (a drain then ends): never, with a fallback."""
        return False

    def flush(self, drain: float = 0.0) -> None:
        """Put on disk what the fallback holds (the undelivered copy); what is queued is posted on its own
        schedule, or with ``drain`` (s) now (:meth:`drain`), before the fallback's flush."""
        if drain:
            self.drain(drain)
        if self.fallback is not None:
            self.fallback.flush()

    def _post(self, batch: list[bytes]) -> list[bytes]:
        """Post ``batch``; the lines the server did not take (unreachable, 5xx, a 4xx not about the data: then
        ``_why``/``_kind`` say what happened); what it refused as data is kept under ``refused``."""
        try:
            r = self._session.post(
                self.url,
                params=self.params,
                data=b"\n".join(batch),
                headers=self.headers,
                auth=self.auth,
                timeout=self.timeout,
            )
        except requests.RequestException as e:
            self.errors += 1
            self._back_off()
            self._why, self._kind = f"cannot reach {self.url}: {e}", "unreachable"
            _let_go(e)
            return batch
        if r.status_code < 300:
            self._backoff = 0.0
            with self._stats_lock:
                self.points_written += len(batch)
            if self._failure:
                logger.info("HTTP sink: writing to %s again", self.url)
                self._failure = None
            return []
        if r.status_code == 404 and "database not found" in _reason(r) and self._create_database():
            return self._post(batch)  # once: the database is there now
        if r.status_code == 413 and len(batch) > 1:
            return self._split(batch)
        if r.status_code in REFUSED_STATUS:
            self._refuse(batch, r.status_code, _reason(r))
            return []
        self.errors += 1
        if r.status_code >= 500:
            self._back_off()
        kind = "rejected (auth or database)" if r.status_code < 500 else "server error"
        self._why = f"HTTP {r.status_code} {kind} from {self.url}: {_reason(r)[:500]}"
        self._kind = f"HTTP {r.status_code}"
        return batch

    def _create_database(self) -> bool:
        """``CREATE DATABASE`` once per sink (:func:`.createdb.create_database`); True when it was created."""
        if not self.create_database:
            return False
        self.create_database = False
        auth_header = {k: v for k, v in self.headers.items() if k == "Authorization"}
        return create_database(self._session, self.query_url, self.params["db"], auth_header, self.auth, self.timeout)

    def _split(self, batch: list[bytes]) -> list[bytes]:
        """HTTP 413 (a body limit, e.g. a proxy's): post each half, and send smaller batches from now on."""
        half = len(batch) // 2
        with self._stats_lock:
            self.batches_split += 1
            self.batch_size = min(self.batch_size, max(1, half))
        if not self._splitting:
            self._splitting = True
            logger.warning(
                "HTTP sink: HTTP 413 (request body too large) from %s for %d line(s); splitting "
                "batches (now at most %d line(s) each)",
                self.url,
                len(batch),
                self.batch_size,
            )
        return self._post(batch[:half]) + self._post(batch[half:])

    def _refuse(self, batch: list[bytes], status: int, reason: str) -> None:
        """Count what the server refused (never as written) and keep it with the server's reason."""
        kept, dropped = refused_lines(batch, reason)
        with self._stats_lock:
            self.points_written += len(batch) - dropped
            self.points_refused += dropped
            new = self._failure != f"HTTP {status} refused"
            self._failure = f"HTTP {status} refused"
        if not kept:
            return
        where = self._keep_refused(
            kept,
            f"HTTP {status} from {self.url}: InfluxDB refused {dropped} of "
            f"{len(batch)} line(s) ({len(kept)} kept here): {reason}",
        )
        (logger.warning if new else logger.debug)(
            "HTTP sink: HTTP %d from %s: %d of %d line(s) refused, %d kept in %s: %s",
            status,
            self.url,
            dropped,
            len(batch),
            len(kept),
            where,
            reason[:500],
        )

    def _keep_refused(self, lines: list[bytes], reason: str) -> str:
        """Keep ``lines`` and the reason in the refused folder, or hand them to the fallback without one; returns
        where they went, in words."""
        if self._refused is None:
            if self.fallback is not None:
                self.fallback.send(lines)
                return "the fallback"
            return "nowhere (LOST: no refused folder, no fallback)"
        self._refused.keep(lines, reason)
        return self.refused_dir + "/"

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
        left = self._stop(wait)
        if left:
            self._give_up(left, "close() timed out", "close() timed out")
        if self.fallback is not None:
            self.fallback.close()
        if self._refused is not None:
            self._refused.close()

    def _stop(self, wait: Optional[float]) -> list[bytes]:
        """Stop the thread once it has posted what it can (at most ``wait`` s); what is still queued."""
        if self._closed:
            return []
        self._closed = True
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(self.timeout + 1.0 if wait is None else wait)
        with self._cond:
            left, self._buffer = self._buffer, []
        if not self._thread.is_alive():
            self._session.close()
        return left

    @property
    def points_spooled(self) -> int:
        """Lines the fallback wrote to disk (``undelivered/``, for replay)."""
        if self.fallback is None:
            return 0
        return sum(c.get("points_written", 0) for c in self.fallback.counters())

    def counters(self) -> list[dict]:
        return [
            {
                "kind": "http",
                "points_written": self.points_written,
                "points_failed": self.points_failed,
                "points_refused": self.points_refused,
                "points_spooled": self.points_spooled,
                "batches_split": self.batches_split,
                "errors": self.errors,
            }
        ]

    def delivery(self) -> list[dict]:
        spooled = self.points_spooled
        return [
            {
                "sink": "http",
                "points_sent": self.points_written,
                "points_refused": self.points_refused,
                "points_spooled": spooled,
                "points_dropped": self.points_lost + max(0, self.points_failed - spooled),  # failed, not on disk
                "errors": self.errors,
            }
        ]


def _let_go(error: BaseException) -> None:
    """Free what a failed request holds now, not at a late full garbage collection: urllib3 keeps the exceptions of
    the chain in locals of the frames their tracebacks hold (a cycle), and some of those frames hold the request's
    body, a whole batch. With the server down, each try left one behind (``benchmarks.memory``'s ``http-dead``:
    22 MB more after 36,000 samples; a process's memory grew by the batches until the collector came)."""
    chain, seen = [error], set()
    while chain:
        e = chain.pop()
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            e.__traceback__ = None
            chain += (e.__cause__, e.__context__)


def _reason(response: requests.Response) -> str:
    """The server's error text: InfluxDB's JSON ``error`` (1.x, 3.x) or ``message`` (2.x), else the body."""
    try:
        body = response.json()
        text = body.get("error") or body.get("message") if isinstance(body, dict) else None
    except ValueError:
        text = None
    return (text or response.text or f"HTTP {response.status_code}").strip()
