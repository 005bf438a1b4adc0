"""A throw-away InfluxDB 1.x server for tests, demos and benchmarks.

Temporary directories, free 127.0.0.1 ports; the Debian package ``influxdb``
provides the binary.

``start()`` writes a config, launches ``influxd`` and waits (bounded) for
``/ping``; ``Influxd.stop()`` terminates it, then kills it. Only the HTTP API
and one ``[[udp]]`` listener (database ``dask_metrics``) are opened, both on
127.0.0.1; the RPC bind address gets a free port too.

Example (needs the ``influxd`` binary)::

    server = start()
    server.write([b"m,t=a v=1i 1"], db=server.create_database("x"))
    server.wait_for('SELECT * FROM "m"', 1, db="x")
    server.stop()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Callable, Union

import requests

INFLUXD = os.environ.get("INFLUXD") or shutil.which("influxd") or "/usr/bin/influxd"
UDP_DATABASE = "dask_metrics"

_CONFIG = """\
reporting-enabled = false
bind-address = "127.0.0.1:{rpc_port}"

[meta]
  dir = "{root}/meta"
  logging-enabled = false

[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  query-log-enabled = false
  trace-logging-enabled = false

[monitor]
  store-enabled = false

[subscriber]
  enabled = false

[continuous_queries]
  enabled = false
  log-enabled = false

[retention]
  enabled = false

[http]
  enabled = true
  bind-address = "127.0.0.1:{http_port}"
  log-enabled = false
  suppress-write-log = true
  pprof-enabled = false

[logging]
  level = "warn"
  suppress-logo = true

[[udp]]
  enabled = true
  bind-address = "127.0.0.1:{udp_port}"
  database = "{udp_database}"
  batch-size = 5000
  batch-pending = 10
  batch-timeout = "50ms"
  read-buffer = 4194304
"""


def _free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> bool:
    """Whether the ``influxd`` binary is present and executable."""
    return os.path.isfile(INFLUXD) and os.access(INFLUXD, os.X_OK)


class Influxd:
    """Handle on a running server: ``url``, ``udp_address`` and small helpers."""

    def __init__(self, proc, root, http_port, udp_port, log_path):
        self.proc = proc
        self.root = root
        self.url = f"http://127.0.0.1:{http_port}"
        self.udp_address = ("127.0.0.1", udp_port)
        self.log_path = log_path
        self._session = requests.Session()

    # -- HTTP helpers -------------------------------------------------------
    def _post_query(self, q: str, db: str | None = None) -> dict:
        params = {"q": q, "epoch": "ns"}
        if db:
            params["db"] = db
        r = self._session.post(f"{self.url}/query", params=params, timeout=10)
        r.raise_for_status()
        body = r.json()
        for result in body.get("results", []):
            if "error" in result:
                raise RuntimeError(f"influxd query {q!r} failed: {result['error']}")
        return body

    def query(self, q: str, db: str = UDP_DATABASE) -> list[dict]:
        """Run InfluxQL; return the rows of every series as dicts (``time`` in ns).

        Tags of ``GROUP BY`` series are merged into each row.
        """
        rows = []
        for result in self._post_query(q, db).get("results", []):
            for series in result.get("series", []) or []:
                tags = series.get("tags") or {}
                for values in series.get("values", []):
                    row = dict(zip(series["columns"], values))
                    row.update(tags)
                    rows.append(row)
        return rows

    def write(self, lines, db: str = UDP_DATABASE, precision: str = "ns") -> requests.Response:
        """POST lines (bytes or str, joined by newlines); raise on a non-2xx answer."""
        if isinstance(lines, (bytes, str)):
            lines = [lines]
        body = b"\n".join(x.encode() if isinstance(x, str) else x for x in lines)
        r = self._session.post(f"{self.url}/write", params={"db": db, "precision": precision}, data=body, timeout=10)
        if r.status_code >= 300:
            raise RuntimeError(f"influxd write failed ({r.status_code}): {r.text}")
        return r

    def create_database(self, name: str) -> str:
        """Create ``name`` (idempotent) and return it."""
        self._post_query(f'CREATE DATABASE "{name}"')
        return name

    def wait_for(
        self,
        q: str,
        predicate_or_min_rows: Union[int, Callable[[list], bool]] = 1,
        timeout: float = 10.0,
        db: str = UDP_DATABASE,
    ) -> list[dict]:
        """Poll ``q`` until it returns enough rows (or the predicate holds).

        Raises ``AssertionError`` with the last result after ``timeout`` s.
        """
        if callable(predicate_or_min_rows):
            ok = predicate_or_min_rows
        else:
            ok = lambda rows: len(rows) >= predicate_or_min_rows  # noqa: E731
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                rows, error = self.query(q, db=db), None
            except RuntimeError as e:  # e.g. database not created yet by the UDP listener
                rows, error = [], e
            if ok(rows):
                return rows
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {q!r} on {db!r}: last rows={rows!r} error={error!r}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    # -- lifecycle ----------------------------------------------------------
    def ping(self) -> bool:
        try:
            return self._session.get(f"{self.url}/ping", timeout=1).status_code == 204
        except requests.RequestException:
            return False

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate (then kill) the server and remove its directory."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._session.close()
        shutil.rmtree(self.root, ignore_errors=True)


def start(timeout: float = 30.0) -> Influxd:
    """Start a private influxd and return its handle once ``/ping`` answers."""
    root = tempfile.mkdtemp(prefix="influxd-test-")
    http_port, rpc_port = _free_port(), _free_port()
    udp_port = _free_port(socket.SOCK_DGRAM)
    config = os.path.join(root, "influxdb.conf")
    with open(config, "w") as f:
        f.write(
            _CONFIG.format(
                root=root,
                rpc_port=rpc_port,
                http_port=http_port,
                udp_port=udp_port,
                udp_database=UDP_DATABASE,
            )
        )
    log_path = os.path.join(root, "influxd.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [INFLUXD, "-config", config],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = Influxd(proc, root, http_port, udp_port, log_path)
    deadline = time.monotonic() + timeout
    while not server.ping():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = server.log_tail()
            server.stop()
            raise RuntimeError(f"influxd did not start (rc={proc.returncode}):\n{tail}")
        time.sleep(0.05)
    return server
