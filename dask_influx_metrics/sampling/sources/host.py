"""Host and worker-process readings: ``/proc`` on Linux, psutil elsewhere.

On Linux (``procfs=True``, the default) the counters come straight from
``/proc`` files kept open (:mod:`.procfs`, psutil's definitions at a fraction
of its cost); otherwise from one psutil call per group (``cpu_times``,
``virtual_memory``, ``disk_io_counters``, ``net_io_counters``) and the
worker's :class:`psutil.Process`. Only requested groups are read; each value
is cast to the type ``schema.FIELDS`` declares. A failing read (or
``disk_io_counters()`` returning ``None``, as in many containers) omits its
fields, is logged once, and never raises.

The agent keeps one source of the ``host`` fields for the host, and one of the
``worker`` fields per worker process (``pid``); which point gets which tags is
:mod:`..collect`'s business.

With ``refresh`` (seconds) the ``host`` counters are read at most that often;
the reads in between repeat the last host reading (``/proc/stat`` and
``/proc/meminfo`` are the most expensive files the sampler reads: the kernel
builds them on every read). The ``worker`` fields are read every time.

``cpu_percent`` (host) is computed per source from ``psutil.cpu_times()``
deltas, exactly as ``psutil.cpu_percent(interval=None)`` does but without its
module-wide "previous call" state, which every caller in the process shares
(several workers in one process would shorten each other's window); the
per-core max and min likewise from the same read's per-core times
(``psutil.cpu_percent(percpu=True)``'s figures). Both CPU percentages are
primed at construction, so the first read covers the time since then. Host
``cpu_percent``: all cores = 100; per core and worker: one core = 100.

Example
-------
>>> src = HostSource(frozenset({("host", "memory_total"), ("worker", "rss")}))
>>> sorted(src.read(HOST)), sorted(src.read(WORKER))
(['memory_total'], ['rss'])
"""

from __future__ import annotations

import logging
import os
import time

import psutil

from ...notices import Once
from ...schema import DISK, FIELDS, HOST, WORKER
from . import procfs as procfs_mod
from .disks import REFRESH_S, DiskUsage

logger = logging.getLogger(__name__)

# (measurement, group) -> fields one psutil call provides
_GROUPS = {
    (HOST, "cpu"): ("cpu_percent", "cpu_percent_core_max", "cpu_percent_core_min", "cpu_count"),
    (HOST, "memory"): ("memory_used", "memory_total", "memory_used_percent"),
    (HOST, "disk"): ("disk_read_bytes", "disk_write_bytes"),
    (HOST, "net"): tuple(f"net_{d}{k}_bytes" for k in ("", "_lo", "_ext") for d in ("recv", "sent")),
    (WORKER, "cpu"): ("cpu_percent",),
    (WORKER, "memory"): ("rss",),
}


def refresh_seconds(host_refresh_ms: float, polling_interval_ms: float) -> float:
    """Seconds between host reads so that they fall on the samples nearest to every
    ``host_refresh_ms`` (0, every sample, when that is at most the polling interval).

    >>> refresh_seconds(200, 50), refresh_seconds(200, 200)
    (0.175, 0.0)
    """
    return 0.0 if host_refresh_ms <= polling_interval_ms else (host_refresh_ms - polling_interval_ms / 2) / 1000.0


def host_sources(settings) -> tuple:
    """``(HostSource, DiskUsage)`` of a sampler's ``host`` and ``disk`` fields (``settings``: a
    :class:`~...config.Settings`), each None when none is asked for: the host counters at the host refresh
    rate, the filesystems at most once a second (:data:`.disks.REFRESH_S`)."""
    refresh = refresh_seconds(settings.host_refresh, settings.polling_interval)
    host = frozenset(f for f in settings.fields if f[0] == HOST)
    disk = frozenset(f for f in settings.fields if f[0] == DISK)
    return (
        HostSource(host, refresh=refresh) if host else None,
        DiskUsage(disk, refresh_seconds(max(settings.host_refresh, 1000 * REFRESH_S), settings.polling_interval))
        if disk
        else None,
    )


def _psutil_cores() -> list:
    """The cores' ``[(name, busy, total)]`` from ``psutil.cpu_times(percpu=True)`` (seconds), as :func:`.procfs.per_core`."""
    return [(i, *_busy_total(t)) for i, t in enumerate(psutil.cpu_times(percpu=True))]


def _busy_total(times) -> tuple[float, float]:
    """(busy, total) CPU seconds as psutil counts them (guest time is in user)."""
    total = sum(times) - getattr(times, "guest", 0) - getattr(times, "guest_nice", 0)
    return total - times.idle - getattr(times, "iowait", 0), total


def _core_spread(cores: list, last: list | None) -> dict:
    """The busiest and idlest core's CPU % since ``last`` and the online cores, from ``cores`` (both
    ``[(name, busy, total)]``: :func:`.procfs.per_core`); none while the online cores changed.

    >>> _core_spread([("cpu0", 110, 200), ("cpu1", 10, 200)], [("cpu0", 10, 100), ("cpu1", 10, 100)])
    {'cpu_count': 2, 'cpu_percent_core_max': 100.0, 'cpu_percent_core_min': 0.0}
    """
    hi, lo = -1.0, 2.0  # shares of the window, 0-1
    if last is not None and len(last) == len(cores):
        for (name, busy, total), (was, busy0, total0) in zip(cores, last):
            if name == was and total > total0:
                share = (busy - busy0) / (total - total0)
                hi, lo = max(hi, share), min(lo, share)
    if hi < 0:
        return {"cpu_count": len(cores)}
    hi, lo = min(max(hi, 0.0), 1.0), min(max(lo, 0.0), 1.0)
    return {
        "cpu_count": len(cores),
        "cpu_percent_core_max": round(100.0 * hi, 1),
        "cpu_percent_core_min": round(100.0 * lo, 1),
    }


class HostSource:
    """``host`` and ``worker`` (process) readings for the requested fields.

    ``pid``: the worker process (default this one); ``process``: a
    :class:`psutil.Process` instead (tests inject one, with ``procfs=False``).
    ``procfs``: read ``/proc`` directly where it exists. ``refresh``: seconds
    between host reads; reads in between repeat the last.
    """

    def __init__(
        self, fields: frozenset, pid: int | None = None, process=None, procfs: bool = True, refresh: float = 0.0
    ):
        pid = process.pid if process is not None else pid
        self._refresh = refresh
        self._host_due = 0.0  # monotonic time of the next host read
        self._host_fields: dict = {}  # the last host read, repeated until the next
        self._groups = {key: tuple(n for n in names if (key[0], n) in fields) for key, names in _GROUPS.items()}
        self._groups = {k: v for k, v in self._groups.items() if v}
        self._once = Once()
        self._process = process
        self._last_cpu = None  # (busy, total) at the previous read
        self._last_percent: dict = {"cpu_percent": 0.0}  # the previous cpu reading
        self._cores = any(n != "cpu_percent" for n in self._groups.get((HOST, "cpu"), ()))  # per-core figures
        self._last_cores = None  # the cores' [(name, busy, total)] at the previous read
        self._last_proc = None  # (process CPU seconds, monotonic) at the previous read (procfs)
        self._proc = None
        if procfs and procfs_mod.available():
            self._proc = procfs_mod.ProcReader(os.getpid() if pid is None else pid)
        elif (WORKER, "cpu") in self._groups or (WORKER, "memory") in self._groups:
            self._process = psutil.Process(pid) if process is None else process
        p = self._proc
        self._calls = {
            (HOST, "cpu"): self._host_cpu,
            (HOST, "memory"): p.memory if p else self._host_memory,
            (HOST, "disk"): p.disk if p else self._host_disk,
            (HOST, "net"): p.net if p else self._host_net,
            (WORKER, "cpu"): self.read_process if p else self._worker_cpu,  # /proc: one call, both groups
            (WORKER, "memory"): self.read_process if p else self._worker_memory,
        }
        # a worker's process on /proc: both files read in one call (the agent reads every worker at every sample)
        self._process_fields = self._groups.get((WORKER, "cpu"), ()) + self._groups.get((WORKER, "memory"), ())
        # per measurement, what a read does: (group, ((field, its type), ...))
        self._plans = {
            m: [(k, tuple((n, FIELDS[m, n].type) for n in names)) for k, names in self._groups.items() if k[0] == m]
            for m in (HOST, WORKER)
        }
        if (HOST, "cpu") in self._groups:  # prime: the first read covers time since now
            self._guard((HOST, "cpu"), self._host_cpu)
        if (WORKER, "cpu") in self._groups:
            self.read(WORKER)

    def _host_cpu(self) -> dict:
        if self._proc:
            (busy, total), cores = self._proc.cpu_times(self._cores)
        else:
            busy, total = _busy_total(psutil.cpu_times())
            cores = _psutil_cores() if self._cores else None
        if self._last_cpu is None:  # priming (at start, or on taking over the host): no window yet
            self._last_cpu, self._last_cores = (busy, total), cores
            if cores:
                self._last_percent = {**self._last_percent, "cpu_count": len(cores)}
            return {}
        d_total = total - self._last_cpu[1]
        if d_total <= 0:  # same clock tick: keep the window open
            return self._last_percent
        d_busy = min(max(busy - self._last_cpu[0], 0.0), d_total)
        self._last_cpu = (busy, total)
        out = {"cpu_percent": round(100.0 * d_busy / d_total, 1)}
        if cores is not None:
            out.update(_core_spread(cores, self._last_cores))
            self._last_cores = cores
        self._last_percent = out
        return out

    def _host_memory(self) -> dict:
        vm = psutil.virtual_memory()
        return {"memory_used": vm.used, "memory_total": vm.total, "memory_used_percent": vm.percent}

    def _host_disk(self) -> dict:
        io = psutil.disk_io_counters(nowrap=False)
        if io is None:
            raise RuntimeError("psutil.disk_io_counters() returned None (no disks visible)")
        return {"disk_read_bytes": io.read_bytes, "disk_write_bytes": io.write_bytes}

    def _host_net(self) -> dict:
        nics = psutil.net_io_counters(pernic=True, nowrap=False)
        if not nics:
            raise RuntimeError("psutil.net_io_counters() found no interfaces")
        out = dict.fromkeys(_GROUPS[HOST, "net"], 0)
        for name, io in nics.items():
            kind = "_lo" if procfs_mod.is_loopback(name) else "_ext"
            for k in ("", kind):
                out[f"net_recv{k}_bytes"] += io.bytes_recv
                out[f"net_sent{k}_bytes"] += io.bytes_sent
        return out

    def _worker_cpu(self) -> dict:
        return {"cpu_percent": self._process.cpu_percent(interval=None)}

    def _worker_memory(self) -> dict:
        return {"rss": self._process.memory_info().rss}

    def read_process(self) -> dict:
        """``read(WORKER)``: the process's fields; where ``/proc`` is read, in one call (the agent reads every worker
        at every sample): its CPU % as psutil's ``Process.cpu_percent`` counts it (CPU seconds over wall seconds
        since the previous read, one core = 100) and its RSS."""
        if self._proc is None or not self._process_fields:
            return self.read(WORKER)
        try:
            cpu, rss = self._proc.process()
        except Exception as e:  # the process is gone, or /proc is not what it should be
            self._report((WORKER, "cpu" if "cpu_percent" in self._process_fields else "memory"), e)
            return {}
        fields = {}
        if "cpu_percent" in self._process_fields:
            now = time.monotonic()
            last, self._last_proc = self._last_proc, (cpu, now)
            ok = last is not None and now > last[1]
            fields["cpu_percent"] = round(100.0 * (cpu - last[0]) / (now - last[1]), 1) if ok else 0.0
        if "rss" in self._process_fields:
            fields["rss"] = rss
        return fields

    def _guard(self, key, call):
        try:
            return call()
        except Exception as e:
            self._report(key, e)
            return None

    def _report(self, key, e: Exception) -> None:
        if self._once(key):
            logger.warning(
                "%s %s unavailable (%s: %s); omitted while it fails (reported once)",
                key[0],
                "/".join(_GROUPS[key]),
                type(e).__name__,
                e,
            )

    def read(self, measurement: str) -> dict:
        """The fields of ``measurement`` (``host`` or ``worker``) now; the host's repeat the last
        reading until ``refresh`` s have passed."""
        if measurement == HOST:
            now = time.monotonic()
            if now < self._host_due:
                return dict(self._host_fields)
            self._host_due = now + self._refresh
        elif self._proc is not None and measurement == WORKER:
            return self.read_process() if self._process_fields else {}
        fields: dict = {}
        calls = self._calls
        for key, names in self._plans[measurement]:
            try:  # (_guard inlined: this runs for every worker at every sample)
                values = calls[key]()
            except Exception as e:
                self._report(key, e)
                continue
            if values is None:
                continue
            for name, kind in names:
                if name not in values:  # not yet (host cpu_percent right after priming)
                    continue
                try:
                    fields[name] = kind(values[name])
                except (TypeError, ValueError) as e:  # an odd value
                    self._report(key, e)
        if measurement == HOST:
            self._host_fields = fields
        return fields

    def close(self) -> None:
        """Close the open ``/proc`` files."""
        if self._proc is not None:
            self._proc.close()
