"""Host and process counters read straight from Linux ``/proc``, with psutil's definitions.

psutil opens, reads and closes a file (and for disks ``access()``es
``/sys/block/<name>`` per disk) on every call; here each file is opened once
and re-read with one ``pread`` (``/proc`` regenerates it at offset 0), so a
sample makes one system call per file. Values equal psutil 7's:

* CPU seconds: ``/proc/stat``'s first line in clock ticks / ``SC_CLK_TCK``; per core, its
  ``cpu<N>`` lines (in ticks: only ratios are taken of them), from the same read.
* memory: ``total`` = MemTotal, ``used`` = total - MemAvailable,
  ``percent`` = round(100 * used / total, 1) (``psutil.virtual_memory``).
* disk bytes: sectors x 512 summed over the devices that have a
  ``/sys/block/<name>`` (whole disks, not partitions; checked once per name).
* network bytes: ``/proc/net/dev`` summed over every interface, and apart over the loopback ones
  (:func:`is_loopback`: the kernel's ``IFF_LOOPBACK`` flag, checked once per name) and the rest.
* a process: ``utime + stime`` of ``/proc/<pid>/stat`` in seconds (for this
  process ``os.times()``, which reads the same counters without a file), RSS =
  ``/proc/<pid>/statm`` resident pages x page size (``stat``'s own ``rss``
  field differs from it by a few pages, so it is not used).

Example
-------
>>> r = ProcReader(os.getpid())
>>> r.memory()["memory_total"] > 0 and r.process()[1] > 0
True
"""

from __future__ import annotations

import os

SECTOR = 512  # psutil's DISK_SECTOR_SIZE: /proc/diskstats counts 512-byte sectors whatever the device
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
IFF_LOOPBACK = 0x8  # <linux/if.h>; /sys/class/net/<name>/flags holds the interface's flags in hex


def is_loopback(name: str, sys_net: str = "/sys/class/net") -> bool:
    """Whether interface ``name`` is a loopback one: the kernel's ``IFF_LOOPBACK`` flag where sysfs shows the
    interface, else its name (``lo``, or one containing "loopback", as the Azure ML ``perf.py`` reference splits).

    >>> is_loopback("lo", sys_net="/nonexistent"), is_loopback("eth0", sys_net="/nonexistent")
    (True, False)
    """
    try:
        with open(os.path.join(sys_net, name, "flags"), "rb") as f:
            return bool(int(f.read().strip(), 16) & IFF_LOOPBACK)
    except (OSError, ValueError):
        return name == "lo" or "loopback" in name.lower()


def available() -> bool:
    """Whether this system has the ``/proc`` files read here (Linux)."""
    return all(os.path.exists(p) for p in ("/proc/stat", "/proc/meminfo", "/proc/self/stat"))


def per_core(block: bytes) -> list:
    """``[(name, busy, total)]`` of the ``cpu<N>`` lines at the start of ``block`` (ticks; psutil's sums: busy =
    user + nice + system + irq + softirq + steal, total = busy + idle + iowait). ~1.4 us a core on the 2-core
    test VM (128 cores: ~180 us), nearly all of it ``int()``; column-wise ``map``/``zip`` was slower.

    >>> per_core(b"cpu0 10 0 5 80 5 0 0 0 0 0\\ncpu1 1 2 3 4 5 6 7 8 9 10\\nintr 1")
    [(b'cpu0', 15, 100), (b'cpu1', 27, 36)]
    """
    out = []
    for line in block.split(b"\n"):
        if line[:3] != b"cpu":
            break
        f = line.split()  # name, user nice system idle iowait irq softirq steal (guest, guest_nice)
        busy = int(f[1]) + int(f[2]) + int(f[3]) + int(f[6]) + int(f[7]) + int(f[8])
        out.append((f[0], busy, busy + int(f[4]) + int(f[5])))
    return out


class ProcFile:
    """One ``/proc`` file kept open; ``read()`` returns its current content."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        self._size = 4096

    def read(self) -> bytes:
        while True:
            data = os.pread(self._fd, self._size, 0)
            if len(data) < self._size:
                return data
            self._size *= 2  # did not fit: read again, bigger

    def close(self) -> None:
        os.close(self._fd)


class ProcReader:
    """The counters of this host and of process ``pid``; files open on first use."""

    def __init__(self, pid: int):
        self.pid, self._me = pid, os.getpid()
        self._stat, self._statm = f"/proc/{pid}/stat", f"/proc/{pid}/statm"
        self._files: dict[str, ProcFile] = {}
        self._process: tuple[int, int] | None = None  # the process's stat and statm, open (process())
        self._disks: dict[bytes, bool] = {}  # /proc/diskstats name -> is a whole disk (has /sys/block/<name>)
        self._loopback: dict[bytes, bool] = {}  # /proc/net/dev name -> is a loopback interface

    def _read(self, path: str) -> bytes:
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = ProcFile(path)
        return f.read()

    def cpu_times(self, cores: bool = False) -> tuple[tuple[float, float], list | None]:
        """(busy, total) host CPU seconds as psutil counts them (guest is in user; iowait is idle) and, with
        ``cores``, the online cores' ``[(name, busy, total)]`` (:func:`per_core`, ticks), from one read of
        ``/proc/stat``."""
        data = self._read("/proc/stat")
        first, _, rest = data.partition(b"\n")
        v = [int(x) / TICKS for x in first.split()[1:11]]
        v += [0.0] * (10 - len(v))
        total = sum(v) - v[8] - v[9]
        per = None
        if cores:
            end = rest.find(b"\nintr")  # the cpu<N> lines come first, together; intr, the longest, next
            per = per_core(rest if end < 0 else rest[:end])
        return (total - v[3] - v[4], total), per

    def memory(self) -> dict:
        mem = {}
        for line in self._read("/proc/meminfo").splitlines():
            key, _, rest = line.partition(b":")
            if key in (b"MemTotal", b"MemAvailable"):
                mem[key] = int(rest.split()[0]) * 1024
                if len(mem) == 2:  # lines 1 and 3 on any kernel since 3.14: stop there
                    break
        total, available = mem[b"MemTotal"], mem.get(b"MemAvailable")
        if not available or not 0 <= available <= total:
            raise RuntimeError("/proc/meminfo has no usable MemAvailable (kernel < 3.14?)")
        used = total - available
        return {"memory_used": used, "memory_total": total, "memory_used_percent": round(100.0 * used / total, 1)}

    def disk(self) -> dict:
        read = write = 0
        for line in self._read("/proc/diskstats").splitlines():
            f = line.split()
            if len(f) not in (7, 14) and len(f) < 18:
                continue
            name = f[2]
            whole = self._disks.get(name)
            if whole is None:
                whole = self._disks[name] = os.access(b"/sys/block/" + name.replace(b"/", b"!"), os.F_OK)
            if whole:
                read += int(f[5] if len(f) > 7 else f[4])
                write += int(f[9] if len(f) > 7 else f[6])
        return {"disk_read_bytes": read * SECTOR, "disk_write_bytes": write * SECTOR}

    def net(self) -> dict:
        recv = sent = lo_recv = lo_sent = 0
        for line in self._read("/proc/net/dev").splitlines()[2:]:
            colon = line.rfind(b":")
            f = line[colon + 1 :].split(None, 9)
            r, s = int(f[0]), int(f[8])
            recv += r
            sent += s
            name = line[:colon].strip()
            lo = self._loopback.get(name)
            if lo is None:
                lo = self._loopback[name] = is_loopback(name.decode(errors="replace"))
            if lo:
                lo_recv += r
                lo_sent += s
        return {
            "net_recv_bytes": recv,
            "net_sent_bytes": sent,
            "net_recv_lo_bytes": lo_recv,
            "net_sent_lo_bytes": lo_sent,
            "net_recv_ext_bytes": recv - lo_recv,
            "net_sent_ext_bytes": sent - lo_sent,
        }

    def process(self) -> tuple[float, int]:
        """``(utime + stime in seconds, RSS in bytes)`` of the process (this process's CPU: ``os.times()``, the
        same counters). The agent reads this for every worker at every sample: the two files' descriptors are
        kept apart from the others' (``stat`` and ``statm`` are far below 4 kB), no call but the reads."""
        if self._process is None:
            self._process = (os.open(self._stat, os.O_RDONLY), os.open(self._statm, os.O_RDONLY))
        stat, statm = self._process
        if self.pid == self._me:
            t = os.times()
            cpu = t.user + t.system
        else:
            data = os.pread(stat, 4096, 0)
            f = data[data.rfind(b")") + 2 :].split()  # after "pid (comm) ": state is f[0], utime f[11], stime f[12]
            cpu = (int(f[11]) + int(f[12])) / TICKS
        return cpu, int(os.pread(statm, 4096, 0).split()[1]) * PAGE

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        for fd in self._process or ():
            os.close(fd)
        self._process = None
