"""The minimal sampler: what sampling a GPU host with every metric cannot avoid, written by hand (issue 46).

The baseline of :mod:`benchmarks.hostcost`, measured in the same run: one
process per host, like the agent, that every ``interval`` makes exactly the
NVML calls the agent cannot do without for every metric, reads the workers' and
the host's ``/proc`` counters, formats the lines with f-strings and sends them
in one ``sendto``. Nothing else: no settings, no error handling beyond NVML's
"not supported" at start, no link with the workers (their task snapshots and
outboxes: tags and task fields are constants here), no beat, no accounting
logic beyond a sum, no delivery counters.

Per GPU a worker uses (its first visible one, as ``gpu.devices: auto``), per sample:
utilization, memory (v2), power, temperature, SM and memory clocks, pstate,
clock event reasons and the compute-process list (each worker's GPU memory);
the GPM sample and one ``nvmlGpmMetricsGet`` of the window's metrics every
100 ms, ``GRAPHICS_UTIL`` alone over 10 s windows; the energy counter (and the
ECC counters the device has) every 10 s; per-process utilization once a second
on a GPU several workers share (or that a process outside the workers uses).
The video engines and the fan are asked once at start and dropped where the
device answers NotSupported, as the agent does. Per worker and sample:
``/proc/<pid>/stat`` (CPU) and ``/proc/<pid>/statm`` (RSS). The host's
``/proc/stat``, ``meminfo``, ``diskstats`` and ``net/dev`` on the samples
``host-refresh`` (200 ms) apart; the filesystems' usage once a second; one
accounting line per GPU every 10 s.

Run by :mod:`benchmarks.hostcost` as ``python -m benchmarks.minimal '<json>'``
(keys: ``address``, ``interval_s``, ``workers`` ``[[pid, gpu index], ...]``,
``paths``, ``counter``: a file whose first 8 bytes it keeps at its sample
count, ``host``, ``session``); ``import pynvml`` is the H200 replay in cost mode
there (``tests/nvml_shim.py``). It prints ``ready`` once sampling; SIGTERM ends it.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import socket
import struct
import sys
import time

GPM_WINDOW_S, GRAPHICS_S, COUNTERS_S, PROCESS_S, DISK_S, HOST_REFRESH_S = 0.1, 10.0, 10.0, 1.0, 1.0, 0.15
GPM = (  # field, NVML_GPM_METRIC_<name>, scale (GRAPHICS_UTIL apart, over GRAPHICS_S)
    ("sm_active", "SM_UTIL", 1.0),
    ("sm_occupancy", "SM_OCCUPANCY", 1.0),
    ("pipe_tensor_active", "ANY_TENSOR_UTIL", 1.0),
    ("pipe_tensor_hmma_active", "HMMA_TENSOR_UTIL", 1.0),
    ("pipe_tensor_imma_active", "IMMA_TENSOR_UTIL", 1.0),
    ("pipe_tensor_dfma_active", "DFMA_TENSOR_UTIL", 1.0),
    ("pipe_tensor_dmma_active", "DMMA_TENSOR_UTIL", 1.0),
    ("dram_active", "DRAM_BW_UTIL", 1.0),
    ("pipe_fp64_active", "FP64_UTIL", 1.0),
    ("pipe_fp32_active", "FP32_UTIL", 1.0),
    ("pipe_fp16_active", "FP16_UTIL", 1.0),
    ("pipe_int_active", "INTEGER_UTIL", 1.0),
    ("pcie_tx_bytes", "PCIE_TX_PER_SEC", 2.0**20),
    ("pcie_rx_bytes", "PCIE_RX_PER_SEC", 2.0**20),
    ("nvlink_tx_bytes", "NVLINK_TOTAL_TX_PER_SEC", 2.0**20),
    ("nvlink_rx_bytes", "NVLINK_TOTAL_RX_PER_SEC", 2.0**20),
)
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def esc(tag: str) -> str:
    return tag.replace(",", r"\,").replace("=", r"\=").replace(" ", r"\ ")


class Gpm:
    """One GPU's GPM: a sample per window, the metrics between the last two; GRAPHICS_UTIL over 10 s."""

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle
        self.buffers = [nvml.nvmlGpmSampleAlloc() for _ in range(3)]
        self.previous = self.opened = None
        self.opened_at = 0.0
        ids = [(f, getattr(nvml, "NVML_GPM_METRIC_" + m, None), s) for f, m, s in GPM]
        self.window = self.request([x for x in ids if x[1] is not None])
        self.graphics = self.request([("gr_engine_active", nvml.NVML_GPM_METRIC_GRAPHICS_UTIL, 1.0)])

    def request(self, metrics):
        req = self.nvml.c_nvmlGpmMetricsGet_t()
        req.version, req.numMetrics = self.nvml.NVML_GPM_METRICS_GET_VERSION, len(metrics)
        for i, (_, metric_id, _) in enumerate(metrics):
            req.metrics[i].metricId = metric_id
        step = ctypes.sizeof(self.nvml.c_nvmlGpmMetric_t)
        unpack = struct.Struct("=" + f"4xId{step - 16}x" * len(metrics)).unpack_from
        return [req, metrics, unpack, memoryview(req).cast("B"), type(req).metrics.offset]

    def between(self, which, first, second) -> str:
        req, metrics, unpack, view, start = which
        ctypes.Structure.__setattr__(req, "sample1", first)
        ctypes.Structure.__setattr__(req, "sample2", second)
        self.nvml.nvmlGpmMetricsGet(req)
        flat = unpack(view, start)
        if flat[::2].count(0) < len(metrics):  # the metrics this GPU lacks: never asked again
            keep = [m for m, status in zip(metrics, flat[::2]) if status == 0]
            which[:] = self.request(keep)
            flat = [x for pair in zip(flat[::2], flat[1::2]) if pair[0] == 0 for x in pair]
        return ",".join(f"{f}={v * s}" for (f, _, s), v in zip(which[1], flat[1::2]))

    def read(self, now: float) -> str:
        current = next(b for b in self.buffers if b is not self.previous and b is not self.opened)
        self.nvml.nvmlGpmSampleGet(self.handle, current)
        previous, self.previous, out = self.previous, current, []
        if previous is not None:
            out.append(self.between(self.window, previous, current))
        if self.opened is None:
            self.opened, self.opened_at = current, now
        elif now - self.opened_at >= GRAPHICS_S:
            out.append(self.between(self.graphics, self.opened, current))
            self.opened, self.opened_at = current, now
        return ",".join(x for x in out if x)


class Gpu:
    def __init__(self, nvml, index: int, users: list):
        self.nvml, self.users = nvml, users
        self.handle = h = nvml.nvmlDeviceGetHandleByIndex(index)
        self.uuid, name = nvml.nvmlDeviceGetUUID(h), nvml.nvmlDeviceGetName(h)
        self.tags = f"index=0,uuid={esc(self.uuid)},name={esc(name)},nvml_index={index}"
        self.total = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2).total
        self.gpm = Gpm(nvml, h)
        self.counters_at = self.process_at = -1e9
        self.last_seen = 0
        cannot = (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission, nvml.NVMLError_FunctionNotFound)
        self.rare = []  # (field, call): the counters this GPU has
        self.extra = []  # (field, call): the video engines and the fan, where the GPU has them
        ecc = lambda e, c: lambda: nvml.nvmlDeviceGetTotalEccErrors(h, e, c)  # noqa: E731
        for field, call, into in (
            ("total_energy_consumption", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h), self.rare),
            *(
                (f"ecc_errors_{c}_{k}", ecc(getattr(nvml, e), getattr(nvml, cc)), self.rare)
                for c, cc in (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC"))
                for k, e in (
                    ("correctable", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                    ("uncorrectable", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
                )
            ),
            ("utilization_encoder", lambda: nvml.nvmlDeviceGetEncoderUtilization(h)[0], self.extra),
            ("utilization_decoder", lambda: nvml.nvmlDeviceGetDecoderUtilization(h)[0], self.extra),
            ("utilization_jpeg", lambda: nvml.nvmlDeviceGetJpgUtilization(h)[0], self.extra),
            ("utilization_ofa", lambda: nvml.nvmlDeviceGetOfaUtilization(h)[0], self.extra),
            ("fan_speed", lambda: nvml.nvmlDeviceGetFanSpeed(h), self.extra),
        ):
            try:
                call()
                into.append((field, call))
            except cannot:
                pass
        self.energy0 = self.energy = 0

    def read(self, now: float, pids: list) -> tuple[str, list]:
        """The device's fields (a line's field set, less the per-worker ones) and each worker's."""
        nvml, h = self.nvml, self.handle
        u = nvml.nvmlDeviceGetUtilizationRates(h)
        m = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
        power = nvml.nvmlDeviceGetPowerUsage(h)
        temp = nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU)
        sm = nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
        mem = nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)
        pstate = nvml.nvmlDeviceGetPerformanceState(h)
        reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        device = (
            f"utilization_gpu={float(u.gpu)},utilization_memory={float(u.memory)},memory_used={m.used / 2**20},"
            f"memory_used_percent={100.0 * m.used / m.total},memory_total={m.total / 2**20},power_draw={power / 1000},"
            f"temperature_gpu={float(temp)},clocks_current_sm={float(sm)},clocks_current_memory={float(mem)},"
            f"pstate={pstate}i,clocks_event_reasons={reasons}i"
        )
        more = [self.gpm.read(now)]
        more += [f"{f}={float(call())}" for f, call in self.extra]
        if now - self.counters_at >= COUNTERS_S:
            self.counters_at = now
            counters = {f: int(call()) for f, call in self.rare}
            self.energy = counters.get("total_energy_consumption", self.energy)
            more += [f"{f}={v}i" for f, v in counters.items()]
        device = ",".join([device, *(x for x in more if x)])
        per_pid: dict = {}
        if (len(self.users) > 1 or any(p.pid not in pids for p in procs)) and now - self.process_at >= PROCESS_S:
            self.process_at = now
            try:
                samples = nvml.nvmlDeviceGetProcessesUtilizationInfo(h, self.last_seen)
            except nvml.NVMLError_NotFound:
                samples = []
            self.last_seen = max([s.timeStamp for s in samples] or [int(time.time() * 1e6)])
            per_pid = {s.pid: (s.smUtil, s.memUtil) for s in samples}
            total = sum(sm for sm, _ in per_pid.values()) or 1.0
        workers = []
        for pid in (w.pid for w in self.users):
            fields = f"worker_memory_used={sum(p.usedGpuMemory for p in procs if p.pid == pid) / 2**20}"
            if self.process_at == now:
                sm_, mem_ = per_pid.get(pid, (0, 0))
                fields += (
                    f",worker_utilization_gpu={float(sm_)},worker_utilization_memory={float(mem_)},"
                    f"worker_gpu_share={100.0 * sm_ / total}"
                )
            workers.append(fields)
        return device, workers


class Worker:
    def __init__(self, pid: int, tags: str):
        self.pid, self.tags = pid, tags
        self.stat = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        self.statm = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        self.last = (0.0, time.monotonic())

    def read(self, now: float) -> str:
        data = os.pread(self.stat, 4096, 0)
        f = data[data.rfind(b")") + 2 :].split()
        cpu = (int(f[11]) + int(f[12])) / TICKS
        rss = int(os.pread(self.statm, 4096, 0).split()[1]) * PAGE
        percent = 100.0 * (cpu - self.last[0]) / (now - self.last[1])
        self.last = (cpu, now)
        return f"cpu_percent={round(percent, 1)},rss={rss}i,tasks=0i,running=0i,managed_bytes=0i"


class Host:
    def __init__(self):
        self.files = {p: os.open(p, os.O_RDONLY) for p in ("/proc/stat", "/proc/meminfo", "/proc/diskstats")}
        self.files["/proc/net/dev"] = os.open("/proc/net/dev", os.O_RDONLY)
        self.disks: dict = {}
        self.last = None
        self.fields = ""
        self.due = 0.0

    def pread(self, path: str) -> bytes:
        return os.pread(self.files[path], 1 << 16, 0)

    def read(self, now: float) -> str:
        if now < self.due:
            return self.fields
        self.due = now + HOST_REFRESH_S
        lines = self.pread("/proc/stat").split(b"\n")
        cores = []
        for line in lines:
            if line[:3] != b"cpu":
                break
            f = line.split()
            busy = int(f[1]) + int(f[2]) + int(f[3]) + int(f[6]) + int(f[7]) + int(f[8])
            cores.append((busy, busy + int(f[4]) + int(f[5])))
        mem = {}
        for line in self.pread("/proc/meminfo").split(b"\n")[:3]:
            key, _, rest = line.partition(b":")
            mem[key] = int(rest.split()[0]) * 1024
        total, used = mem[b"MemTotal"], mem[b"MemTotal"] - mem[b"MemAvailable"]
        read = write = 0
        for line in self.pread("/proc/diskstats").split(b"\n")[:-1]:
            f = line.split()
            whole = self.disks.get(f[2])
            if whole is None:
                whole = self.disks[f[2]] = os.access(b"/sys/block/" + f[2].replace(b"/", b"!"), os.F_OK)
            if whole:
                read, write = read + int(f[5]), write + int(f[9])
        net = [0, 0, 0, 0]
        for line in self.pread("/proc/net/dev").split(b"\n")[2:-1]:
            colon = line.rfind(b":")
            f = line[colon + 1 :].split(None, 9)
            lo = 2 if line[:colon].strip() == b"lo" else 0
            net[lo] += int(f[0])
            net[lo + 1] += int(f[8])
        last, self.last = self.last, cores
        if last is None:
            return ""
        share = [(b - b0) / max(1, t - t0) for (b, t), (b0, t0) in zip(cores, last)]
        self.fields = (
            f"cpu_percent={round(100.0 * share[0], 1)},cpu_percent_core_max={round(100.0 * max(share[1:]), 1)},"
            f"cpu_percent_core_min={round(100.0 * min(share[1:]), 1)},cpu_count={len(cores) - 1}i,"
            f"memory_used={used}i,memory_total={total}i,memory_used_percent={round(100.0 * used / total, 1)},"
            f"disk_read_bytes={read * 512}i,disk_write_bytes={write * 512}i,"
            f"net_recv_bytes={net[0] + net[2]}i,net_sent_bytes={net[1] + net[3]}i,net_recv_lo_bytes={net[2]}i,"
            f"net_sent_lo_bytes={net[3]}i,net_recv_ext_bytes={net[0]}i,net_sent_ext_bytes={net[1]}i"
        )
        return self.fields


def main(config: dict) -> None:
    import pynvml as nvml

    nvml.nvmlInit()
    common = f"host={esc(config['host'])},session={config['session']}"
    pids = [pid for pid, _ in config["workers"]]
    workers = [Worker(pid, f"{common},worker=w{i},job=0,dag=0") for i, (pid, _) in enumerate(config["workers"])]
    used = sorted({g for _, g in config["workers"]})
    gpus = [Gpu(nvml, g, [w for w, (_, i) in zip(workers, config["workers"]) if i == g]) for g in used]
    host, paths = Host(), config["paths"]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    address = tuple(config["address"])
    with open(config["counter"], "r+b") as f:
        counter = mmap.mmap(f.fileno(), 8)
    interval, samples, disk_at, account_at = config["interval_s"], 0, -1e9, time.monotonic()
    print("ready", flush=True)
    due = time.monotonic()
    while True:
        now, ns = time.monotonic(), time.time_ns()
        lines = [f"worker,{w.tags} {w.read(now)} {ns}" for w in workers]
        for gpu in gpus:
            device, each = gpu.read(now, pids)
            lines += [f"gpu,{w.tags},{gpu.tags} {device},{mine} {ns}" for w, mine in zip(gpu.users, each)]
        host_fields = host.read(now)
        if host_fields:
            lines.append(f"host,{workers[0].tags} {host_fields} {ns}")
        if now - disk_at >= DISK_S:
            disk_at = now
            for path in paths:
                st = os.statvfs(path)
                total, used = st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize
                lines.append(
                    f"disk,{workers[0].tags},path={esc(path)} used_percent={100.0 * used / max(1, total)},"
                    f"used={used}i,total={total}i {ns}"
                )
        if now - account_at >= COUNTERS_S:
            for gpu in gpus:
                lines.append(
                    f"accounting,{common},worker=agent,job=idle,uuid={esc(gpu.uuid)},since={account_at} "
                    f"gpu_seconds={now - account_at},busy_seconds=0.0,sm_active_seconds=0.0,tensor_active_seconds=0.0,"
                    f"energy_joules={(gpu.energy - gpu.energy0) / 1000},memory_peak_bytes=0i,memory_byte_seconds=0.0 {ns}"
                )
                gpu.energy0 = gpu.energy
            account_at = now
        try:
            sock.sendto("\n".join(lines).encode(), address)
        except OSError:  # the receiver's buffer is full: the datagram is dropped, as the agent's would be
            pass
        samples += 1
        struct.pack_into("q", counter, 0, samples)
        due += interval
        late = time.monotonic() - due
        if late > interval:  # fell behind: skip the missed ticks, as the Sampler does
            due += (late // interval) * interval
        time.sleep(max(0.0, due - time.monotonic()))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
