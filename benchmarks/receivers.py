"""The receiving end of a benchmark: a loopback UDP socket drained by a process of its own, the kernel's drop
count of a socket, a throw-away influxd (stopped in ``finally``) and the points it stored."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import socket
import time


# -- UDP ---------------------------------------------------------------------------
def _drain_main(conn, rcvbuf: int, keep) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.05)
    conn.send(sock.getsockname())
    datagrams = lines = 0
    times = []
    buf = bytearray(65536)
    stop_at = None
    for _ in range(100_000_000):  # bounded; ends after "stop" plus 0.3 s of quiet
        try:
            n = sock.recv_into(buf)
            datagrams += 1
            got = [x for x in bytes(buf[:n]).split(b"\n") if x]
            lines += len(got)
            if keep:
                times.extend(int(x.rsplit(b" ", 1)[1]) for x in got if x.startswith(keep[0]) and keep[1] in x)
            continue
        except socket.timeout:
            pass
        if stop_at is None and conn.poll():
            conn.recv()
            stop_at = time.monotonic()
        if stop_at is not None and time.monotonic() - stop_at > 0.3:
            break
    conn.send({"datagrams": datagrams, "lines": lines, "times": times})
    sock.close()


class Drain:
    """A loopback UDP socket drained (and counted) by a separate process.

    ``with Drain() as d: ...send to d.address...``; then ``d.counts()``.
    ``keep=(prefix, part)``: also collect the timestamps of the lines that
    start with ``prefix`` and contain ``part`` (``counts()["times"]``).
    """

    def __init__(self, rcvbuf: int = 4 << 20, keep: tuple | None = None):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_drain_main, args=(child, rcvbuf, keep), daemon=True)
        self._proc.start()
        if not self._conn.poll(30):
            raise RuntimeError("UDP drain process did not start")
        self.address = self._conn.recv()
        self._stopped = False

    def counts(self) -> dict:
        """Stop draining (after 0.3 s of quiet) and return {datagrams, lines, times} received."""
        self._conn.send("stop")
        self._stopped = True
        if not self._conn.poll(30):
            raise RuntimeError("UDP drain process did not answer")
        return self._conn.recv()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._stopped:
            try:
                self._conn.send("stop")
            except OSError:
                pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)


def udp_drops(port: int) -> int | None:
    """Kernel drop counter of the local UDP socket bound to ``port`` (/proc/net/udp), or None."""
    try:
        with open("/proc/net/udp") as f:
            next(f)
            for line in f:
                parts = line.split()
                if parts[1].endswith(f":{port:04X}"):
                    return int(parts[-1])
    except OSError:
        pass
    return None


# -- influxd ---------------------------------------------------------------------
@contextlib.contextmanager
def influxd(udp_overrides: dict | None = None, data_settings: dict | None = None):
    """A fresh ``localinflux.start()`` server, stopped in ``finally``.

    ``udp_overrides`` (e.g. ``{"read-buffer": 4194304}``) replaces values of the
    ``[[udp]]`` listener in the shipped config for this server only;
    ``data_settings`` (e.g. ``{"cache-snapshot-write-cold-duration": "1s"}``) are added to ``[data]``.
    """
    from dask_influx_metrics.demo import localinflux

    shipped = localinflux._CONFIG
    config = shipped.replace(
        "[data]\n",
        "[data]\n" + "".join(f"  {key} = {json.dumps(value)}\n" for key, value in (data_settings or {}).items()),
        1,
    )
    for key, value in (udp_overrides or {}).items():
        lines = config.split("\n")
        hits = [i for i, x in enumerate(lines) if x.strip().startswith(f"{key} =")]
        if len(hits) != 1:
            raise ValueError(f"no single {key!r} in localinflux's config")
        lines[hits[-1]] = f"  {key} = {json.dumps(value)}"
        config = "\n".join(lines)
    localinflux._CONFIG = config
    try:
        server = localinflux.start()
    finally:
        localinflux._CONFIG = shipped
    try:
        yield server
    finally:
        server.stop()


def udp_listener_config() -> dict:
    """The shipped ``[[udp]]`` settings of localinflux (as text values)."""
    from dask_influx_metrics.demo import localinflux

    section = localinflux._CONFIG.split("[[udp]]", 1)[1]
    return {
        k.strip(): v.strip().strip('"') for k, _, v in (x.partition("=") for x in section.strip().splitlines()) if v
    }


def count_points(server, db: str, fields: dict) -> dict:
    """{measurement: points stored} counting one always-present field per measurement."""
    out = {}
    for measurement, field in fields.items():
        rows = server.query(f'SELECT count("{field}") FROM "{measurement}"', db=db)
        out[measurement] = int(rows[0]["count"]) if rows else 0
    return out


def wait_count(server, db: str, fields: dict, expected: int, timeout: float = 30.0, quiet: float = 2.0) -> int:
    """Poll the stored total until it reaches ``expected`` or stops growing for ``quiet`` s."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        try:
            total = sum(count_points(server, db, fields).values())
        except RuntimeError:  # database not there yet
            total = 0
        now = time.monotonic()
        if total != last:
            last, since = total, now
        if total >= expected or now - since > quiet or now > deadline:
            return total
        time.sleep(0.25)
