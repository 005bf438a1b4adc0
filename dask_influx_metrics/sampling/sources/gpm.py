"""GPU performance metrics (GPM, Hopper and newer): how busy the SMs, tensor cores and memory were.

``utilization_gpu`` says only that *some* kernel ran; GPM says how much of the
GPU it used. NVML computes each metric from TWO samples (``nvmlGpmSampleGet``,
32-58 us of CPU on an H200) and needs them at least ~100 ms apart, so
:class:`GpmReader` keeps the previous sample and takes a new one every k-th
call, k = ceil(0.1 s / polling interval): every call at 100 ms and slower,
every 2nd call at 50 ms. It returns ``{}`` on the calls in between and until
two samples exist: a value is written only when NVML computed one, for the
window since the previous GPM sample.

What each metric costs differs by three orders of magnitude: on an H200 one
``nvmlGpmMetricsGet`` costs 1-3 us of CPU for any set of metrics without
``GRAPHICS_UTIL``, and 1.0-1.4 ms whenever ``GRAPHICS_UTIL`` is in it
(``tests/data/nvml_h200_costs.md``). So ``gr_engine_active`` (``GRAPHICS_UTIL``;
``utilization_gpu`` says nearly the same: 99.9 vs 99-100 under a matmul) is
computed alone, over a long window of :data:`GRAPHICS_WINDOW_S` (10 s): between
the GPM sample that opened the window (kept in a third buffer) and the current
one, so it is still the exact average over that window, at ~0.1-0.14 ms of CPU
per GPU per second instead of 10-14 ms.

Field names follow DCGM's profiling fields (``DCGM_FI_PROF_SM_ACTIVE`` ->
``sm_active``) where GPM measures the same thing; DCGM reports ratios 0-1, we
write percent like ``utilization_gpu``, and bytes per second for PCIe/NVLink
(GPM gives MiB/s). :data:`METRICS` is the table.

A MIG instance is sampled through its parent GPU and GPU-instance id
(``nvmlGpmMigSampleGet``): :meth:`GpmReader.for_mig`. Its metrics describe the
instance only; nothing of the parent is ever charged to it.

A device or driver without GPM (``nvmlGpmQueryDeviceSupport`` says no, or this
pynvml/driver lacks the calls) returns ``{}`` forever and says so once.
A metric one device does not offer (per-metric NVML status) is left out.

>>> import sys; sys.path.insert(0, "tests"); from fake_nvml import FakeNvml
>>> nvml = FakeNvml("nvml_h100_shared.json"); nvml.nvmlInit()
>>> gpm = GpmReader(nvml, nvml.nvmlDeviceGetHandleByIndex(0), interval_s=0.05)
>>> gpm.read(), gpm.read(), round(gpm.read()["sm_occupancy"], 1)
({}, {}, 14.2)
>>> t = [0.0]
>>> gpm = GpmReader(nvml, nvml.nvmlDeviceGetHandleByIndex(0), fields={"sm_active", "gr_engine_active"}, clock=lambda: t[0])
>>> sorted(gpm.read()), sorted(gpm.read())
([], ['sm_active'])
>>> t[0] = 10.0; sorted(gpm.read())
['gr_engine_active', 'sm_active']
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import operator
import struct
import time
from typing import NamedTuple

from ...names import GpmState
from ...notices import Once

logger = logging.getLogger(__name__)

_set = ctypes.Structure.__setattr__
MIN_WINDOW_S = 0.1  # NVML's GPM refresh: shorter windows give no new data
GRAPHICS_WINDOW_S = 10.0  # gr_engine_active's window: its metric costs ~1,000x the others (module doc)
GRAPHICS = "GRAPHICS_UTIL"
_MIB = float(2**20)


class Metric(NamedTuple):
    field: str  # ours, in schema.FIELDS
    gpm: str  # the NVML_GPM_METRIC_<name>
    scale: float = 1.0  # ours = NVML's x scale: percent as is; MiB/s -> bytes/s


METRICS: tuple[Metric, ...] = (
    Metric("gr_engine_active", "GRAPHICS_UTIL"),  # DCGM_FI_PROF_GR_ENGINE_ACTIVE
    Metric("sm_active", "SM_UTIL"),  # DCGM_FI_PROF_SM_ACTIVE
    Metric("sm_occupancy", "SM_OCCUPANCY"),  # DCGM_FI_PROF_SM_OCCUPANCY
    Metric("pipe_tensor_active", "ANY_TENSOR_UTIL"),  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    Metric("pipe_tensor_hmma_active", "HMMA_TENSOR_UTIL"),  # DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE
    Metric("pipe_tensor_imma_active", "IMMA_TENSOR_UTIL"),  # DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE
    Metric("pipe_tensor_dfma_active", "DFMA_TENSOR_UTIL"),  # DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE
    Metric("pipe_tensor_dmma_active", "DMMA_TENSOR_UTIL"),  # GPM only
    Metric("dram_active", "DRAM_BW_UTIL"),  # DCGM_FI_PROF_DRAM_ACTIVE
    Metric("pipe_fp64_active", "FP64_UTIL"),  # DCGM_FI_PROF_PIPE_FP64_ACTIVE
    Metric("pipe_fp32_active", "FP32_UTIL"),  # DCGM_FI_PROF_PIPE_FP32_ACTIVE
    Metric("pipe_fp16_active", "FP16_UTIL"),  # DCGM_FI_PROF_PIPE_FP16_ACTIVE
    Metric("pipe_int_active", "INTEGER_UTIL"),  # DCGM_FI_PROF_PIPE_INT_ACTIVE
    Metric("pcie_tx_bytes", "PCIE_TX_PER_SEC", _MIB),  # DCGM_FI_PROF_PCIE_TX_BYTES; MiB/s -> bytes/s
    Metric("pcie_rx_bytes", "PCIE_RX_PER_SEC", _MIB),  # DCGM_FI_PROF_PCIE_RX_BYTES
    Metric("nvlink_tx_bytes", "NVLINK_TOTAL_TX_PER_SEC", _MIB),  # DCGM_FI_PROF_NVLINK_TX_BYTES
    Metric("nvlink_rx_bytes", "NVLINK_TOTAL_RX_PER_SEC", _MIB),  # DCGM_FI_PROF_NVLINK_RX_BYTES
)
FIELDS = frozenset(m.field for m in METRICS)


class GpmReader:
    """GPM metrics of one GPU (or one MIG instance), from consecutive samples.

    ``nvml``: the pynvml module; ``handle``: the GPU's handle (for a MIG instance,
    the parent's, with ``gpu_instance_id``; see :meth:`for_mig`). ``interval_s``:
    how often :meth:`read` is called; ``window_s``: the GPM window (at least, and
    by default, 100 ms). ``fields``: the wanted ones (default all).
    ``label`` names the device in the one message about missing support.
    """

    def __init__(
        self,
        nvml,
        handle,
        *,
        gpu_instance_id: int | None = None,
        interval_s: float = MIN_WINDOW_S,
        window_s: float = MIN_WINDOW_S,
        fields=FIELDS,
        label: str = "GPU",
        clock=time.monotonic,
    ):
        self._nvml, self._handle, self._gi = nvml, handle, gpu_instance_id
        self._label, self._clock = label, clock
        window_s = max(window_s, MIN_WINDOW_S)  # a longer window costs less (one ~39 us sample per window)
        self.every = max(1, math.ceil(window_s / interval_s - 1e-9))  # k: a sample every k-th call
        self._calls = 0
        known = [(m, getattr(nvml, "NVML_GPM_METRIC_" + m.gpm, None)) for m in METRICS if m.field in fields]
        known = [(m, i) for m, i in known if i is not None]  # ids this pynvml names
        self._metrics = [(m, i) for m, i in known if m.gpm != GRAPHICS]  # each window
        self._graphics = [(m, i) for m, i in known if m.gpm == GRAPHICS]  # alone, every GRAPHICS_WINDOW_S
        self._samples: list = []  # 2 buffers (3 with the graphics window) once allocated
        self._previous = self._opened = None  # the window's first sample; the graphics window's
        self._opened_at = 0.0
        self._once = Once()
        self.state, self.unsupported = self._support()  # the state, and why there is no GPM (None: there is)
        if self.unsupported:
            logger.info("%s: GPM metrics left out (%s)", label, self.unsupported)

    @classmethod
    def for_mig(cls, nvml, mig_handle, **kw) -> "GpmReader":
        """The reader of one MIG instance: sampled through its parent and GPU-instance id."""
        parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_handle)
        return cls(nvml, parent, gpu_instance_id=nvml.nvmlDeviceGetGpuInstanceId(mig_handle), **kw)

    def _support(self) -> tuple[GpmState, str | None]:
        """This device's :class:`GpmState`, and why it has no GPM (None: it has)."""
        nvml = self._nvml
        needed = (
            "nvmlGpmQueryDeviceSupport",
            "nvmlGpmSampleAlloc",
            "nvmlGpmMetricsGet",
            "c_nvmlGpmMetricsGet_t",
            "nvmlGpmMigSampleGet" if self._gi is not None else "nvmlGpmSampleGet",
        )
        missing = [n for n in needed if getattr(nvml, n, None) is None]
        if missing:
            return GpmState.NO_CALLS, f"this pynvml lacks {', '.join(missing)}; nvidia-ml-py >= 12.535 has them"
        if not self._metrics and not self._graphics:
            return GpmState.NO_CALLS, "no wanted GPM metric is known to this pynvml"
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice:
                return GpmState.UNSUPPORTED, "the device does not support GPM (Hopper or newer needed)"
            self._samples = [nvml.nvmlGpmSampleAlloc() for _ in range(3 if self._graphics else 2)]
        except nvml.NVMLError_NotSupported as e:
            return GpmState.UNSUPPORTED, f"NVML: {type(e).__name__}: {e}"
        except nvml.NVMLError as e:
            return GpmState.ERROR, f"NVML: {type(e).__name__}: {e}"
        self._results = _results_layout(nvml)
        self._requests = {"window": self._asking(self._metrics), "graphics": self._asking(self._graphics)}
        return GpmState.ON, None

    def _asking(self, metrics) -> tuple:
        """``(request, metrics, results, names, scales)``: the nvmlGpmMetricsGet argument for ``metrics``, built
        once (only its two samples change per call), ``results()``: each metric's ``nvmlReturn, value``, flat,
        and each metric's field name and scale; or None for no metric. The results are unpacked in one go from
        the structure's bytes where its layout is the usual one (pynvml's attribute access costs ~1 us per
        field)."""
        if not metrics:
            return None
        request, n = self._nvml.c_nvmlGpmMetricsGet_t(), len(metrics)
        request.version = self._nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = n
        for i, (_, metric_id) in enumerate(metrics):
            request.metrics[i].metricId = metric_id
        if self._results is None:
            results = lambda: tuple(x for m in request.metrics[:n] for x in (m.nvmlReturn, m.value))  # noqa: E731
        else:
            start, step = self._results
            results = functools.partial(_unpacker(step, n).unpack_from, memoryview(request).cast("B"), start)
        return request, metrics, results, tuple(m.field for m, _ in metrics), tuple(m.scale for m, _ in metrics)

    def due(self) -> bool:
        """Whether the next :meth:`read` takes a GPM sample (every k-th call, where GPM works)."""
        return not self.unsupported and self._calls % self.every == 0

    def read(self) -> dict:
        """The wanted metrics for the window since the previous GPM sample, on every k-th call; else {}.
        ``gr_engine_active`` on the call that closes a graphics window (:data:`GRAPHICS_WINDOW_S`)."""
        calls, self._calls = self._calls, self._calls + 1
        if calls % self.every or self.unsupported:
            return {}
        previous, opened = self._previous, self._opened
        for current in self._samples:  # a buffer neither window holds
            if current is not previous and current is not opened:
                break
        try:
            self._take(current)
        except self._nvml.NVMLError as e:
            self._previous = self._opened = None  # a gap: the next windows start afresh
            return self._fail("sample", e)
        self._previous, fields = current, {}
        try:
            if previous is not None and self._requests["window"]:
                fields = self._metrics_between("window", previous, current)
            if self._requests["graphics"]:
                now = self._clock()
                if opened is None:
                    self._opened, self._opened_at = current, now
                elif now - self._opened_at >= GRAPHICS_WINDOW_S:
                    self._opened, self._opened_at = current, now
                    fields.update(self._metrics_between("graphics", opened, current))
        except self._nvml.NVMLError as e:
            return self._fail("metrics", e)
        return fields

    def _take(self, sample) -> None:
        if self._gi is None:
            self._nvml.nvmlGpmSampleGet(self._handle, sample)
        else:
            self._nvml.nvmlGpmMigSampleGet(self._handle, self._gi, sample)

    def _metrics_between(self, which: str, first, second) -> dict:
        """The metrics of request ``which`` between two samples; one NVML does not offer on this device
        (NVLink on a PCIe card) is said once and never asked for again."""
        nvml, (request, metrics, results, names, scales) = self._nvml, self._requests[which]
        _set(request, "sample1", first)  # ctypes' own setter: pynvml's Python one only encodes str
        _set(request, "sample2", second)
        nvml.nvmlGpmMetricsGet(request)
        flat, ok = results(), nvml.NVML_SUCCESS
        if flat[::2].count(ok) == len(names):  # every metric answered (the usual case): the dict built in C
            return dict(zip(names, map(operator.mul, flat[1::2], scales)))
        fields, unsupported = {}, []
        values = iter(flat)
        for (metric, metric_id), status, value in zip(metrics, values, values):
            if status == ok:
                fields[metric.field] = value * metric.scale
                continue
            if self._once(metric.field):
                logger.info(
                    "%s: GPM metric %s not available (NVML status %d); left out", self._label, metric.gpm, status
                )
            if status == nvml.NVML_ERROR_NOT_SUPPORTED:
                unsupported.append(metric_id)
        if unsupported:
            self._requests[which] = self._asking([(m, i) for m, i in metrics if i not in unsupported])
        return fields

    def _fail(self, what: str, error: Exception) -> dict:
        if self._once(what):
            logger.warning(
                "%s: GPM %s failed (%s: %s); left out of this sample (reported once)",
                self._label,
                what,
                type(error).__name__,
                error,
            )
        return {}

    def close(self) -> None:
        """Free the two GPM samples NVML allocated."""
        for sample in self._samples:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except self._nvml.NVMLError:
                pass
        self._samples = []
        self.unsupported = self.unsupported or "closed"


@functools.lru_cache
def _unpacker(step: int, n: int) -> struct.Struct:
    """``n`` results of ``step`` bytes: each ``metricId`` (skipped), ``nvmlReturn``, ``value``, the rest."""
    return struct.Struct("=" + f"4xId{step - 16}x" * n)


def _results_layout(nvml) -> tuple[int, int] | None:
    """``(offset of metrics[0], size of one)`` in ``c_nvmlGpmMetricsGet_t`` when each result starts with
    ``metricId`` (uint), ``nvmlReturn`` (uint), ``value`` (double) at 0, 4 and 8; else None (field by field)."""
    try:
        request, metric = nvml.c_nvmlGpmMetricsGet_t, nvml.c_nvmlGpmMetric_t
        fields = [f[0] for f in metric._fields_[:3]]
        offsets = (metric.metricId.offset, metric.nvmlReturn.offset, metric.value.offset)
        usual = fields == ["metricId", "nvmlReturn", "value"] and offsets == (0, 4, 8)
        return (request.metrics.offset, ctypes.sizeof(metric)) if usual else None
    except (AttributeError, TypeError):
        return None
