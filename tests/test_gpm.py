"""GpmReader against the recorded H100 GPM pair (tests/data/nvml_h100_shared.json) and the MIG fixture."""

from __future__ import annotations

import logging

import pynvml
import pytest
from fake_nvml import FakeNvml
from fake_nvml import prices as fake_prices

from dask_influx_metrics import schema
from dask_influx_metrics.names import GpmState
from dask_influx_metrics.sampling.gpus import gpm_found
from dask_influx_metrics.sampling.sources.gpm import FIELDS, GRAPHICS_WINDOW_S, METRICS, GpmReader
from dask_influx_metrics.sampling.sources.nvml import NvmlDevices

MIB = 2**20


def h100(phase=None):
    nvml = FakeNvml("nvml_h100_shared.json", phase=phase)
    nvml.nvmlInit()
    return nvml, nvml.nvmlDeviceGetHandleByIndex(0)


def reads(reader, n):
    return [reader.read() for _ in range(n)]


def test_recorded_matmul_loop_is_tensor_bound_at_low_occupancy():
    nvml, handle = h100()
    t = [0.0]
    reader = GpmReader(nvml, handle, interval_s=0.2, clock=lambda: t[0])
    first, second = reads(reader, 2)
    assert first == {}  # one sample: no window yet
    recorded = nvml.devices[0]["gpm"]["metrics"]
    t[0] = GRAPHICS_WINDOW_S
    assert reader.read()["gr_engine_active"] == pytest.approx(recorded["GRAPHICS_UTIL"]["value"])
    assert second == pytest.approx(
        {
            "sm_active": 96.19118036660457,
            "sm_occupancy": 14.215301385462014,
            "pipe_tensor_active": 93.35882858142543,
            "pipe_tensor_hmma_active": recorded["HMMA_TENSOR_UTIL"]["value"],
            "dram_active": 26.0522261752282,
            "pipe_fp16_active": 0.0,
            "pipe_fp32_active": 0.0,
            "pipe_int_active": recorded["INTEGER_UTIL"]["value"],
            "pcie_tx_bytes": recorded["PCIE_TX_PER_SEC"]["value"] * MIB,  # MiB/s -> bytes/s
            "pcie_rx_bytes": recorded["PCIE_RX_PER_SEC"]["value"] * MIB,
        }
    )


def test_no_field_without_a_value_from_nvml(caplog):
    """FP64, IMMA/DFMA/DMMA tensor and NVLink were not recorded (NVML status per metric): left out, said once."""
    nvml, handle = h100()
    reader = GpmReader(nvml, handle, label="GPU 0", clock=lambda: GRAPHICS_WINDOW_S * nvml.calls_to("nvmlGpmSampleGet"))
    with caplog.at_level(logging.INFO):
        got = reads(reader, 4)
    recorded = {m.field for m in METRICS if m.gpm in nvml.devices[0]["gpm"]["metrics"]}
    assert got[0] == {} and all(set(g) == recorded for g in got[1:])
    absent = FIELDS - recorded
    assert absent == {
        "pipe_fp64_active",
        "pipe_tensor_imma_active",
        "pipe_tensor_dfma_active",
        "pipe_tensor_dmma_active",
        "nvlink_tx_bytes",
        "nvlink_rx_bytes",
    }
    said = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert len(said) == len(absent)  # once each, not once per sample


@pytest.mark.parametrize("interval_s, every", [(0.05, 2), (0.1, 1), (0.2, 1), (0.02, 5), (0.03, 4)])
def test_sample_every_kth_call_for_a_window_of_100_ms(interval_s, every):
    nvml, handle = h100()
    reader = GpmReader(nvml, handle, interval_s=interval_s)
    assert reader.every == every
    got = reads(reader, 1 + 3 * every)
    assert [bool(g) for g in got] == [i > 0 and i % every == 0 for i in range(len(got))]
    assert nvml.calls_to("nvmlGpmSampleGet") == 4  # one sample per window, none in between


def test_a_longer_window_samples_less_often():
    nvml, handle = h100()
    reader = GpmReader(nvml, handle, interval_s=0.05, window_s=0.4)
    assert reader.every == 8
    assert GpmReader(nvml, handle, interval_s=0.05, window_s=0.01).every == 2  # never below 100 ms


def test_only_the_wanted_metrics_are_asked_for():
    nvml, handle = h100()
    reader = GpmReader(nvml, handle, fields={"sm_active", "sm_occupancy"})
    assert reads(reader, 2)[1].keys() == {"sm_active", "sm_occupancy"}


def test_idle_phase_reads_zero_activity():
    nvml, handle = h100("idle")
    got = reads(GpmReader(nvml, handle), 2)[1]
    assert got["sm_active"] == got["sm_occupancy"] == got["pipe_tensor_active"] == 0.0


def test_graphics_util_is_read_alone_once_per_graphics_window():
    """Issue 32: on an H200 a GPM metrics call costs ~2 us, and 1.0-1.4 ms with GRAPHICS_UTIL in it. The
    per-window call leaves it out; it is computed alone over the samples GRAPHICS_WINDOW_S apart: one window
    of gr_engine_active per 10 s, the average between the sample that opened it and the one that closes it."""
    nvml = FakeNvml("nvml_h200_shared.json", cost="idle")
    nvml.nvmlInit()
    t = [0.0]
    reader = GpmReader(nvml, nvml.nvmlDeviceGetHandleByIndex(0), interval_s=0.1, clock=lambda: t[0])
    got = []
    for i in range(201):  # 20 s of 100 ms samples
        t[0] = i * 0.1
        got.append(reader.read())
    graphics = [i for i, g in enumerate(got) if "gr_engine_active" in g]
    assert graphics == [100, 200] and all("sm_active" in g for g in got[1:])
    assert nvml.charged["nvmlGpmSampleGet"] == 201, "one GPM sample per window, none added for graphics"
    assert nvml.charged["nvmlGpmMetricsGet"] == 200 + 2
    per_window = nvml.burned_us / 200
    prices = fake_prices()
    cheap = prices["nvmlGpmSampleGet"] + prices["nvmlGpmMetricsGet"]
    assert per_window < cheap + 2 * prices["nvmlGpmMetricsGet+GRAPHICS_UTIL"] / 200 + 1, "was ~1,460 us per window"


def test_gpu_without_gpm_returns_nothing_and_says_so_once(caplog):
    nvml = FakeNvml()  # A100s and a K80: no GPM
    nvml.nvmlInit()
    with caplog.at_level(logging.INFO):
        reader = GpmReader(nvml, nvml.nvmlDeviceGetHandleByIndex(0), label="GPU 0")
        assert reads(reader, 5) == [{}] * 5
    assert "Hopper or newer" in reader.unsupported and reader.state == GpmState.UNSUPPORTED
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "GPU 0: GPM metrics left out" in said[0]
    assert nvml.calls_to("nvmlGpmSampleGet") == 0


def test_pynvml_without_gpm_calls_returns_nothing(monkeypatch):
    nvml, handle = h100()
    monkeypatch.setattr(nvml, "nvmlGpmSampleAlloc", None, raising=False)  # nvidia-ml-py < 12.535
    reader = GpmReader(nvml, handle)
    assert reads(reader, 3) == [{}] * 3 and "nvidia-ml-py" in reader.unsupported
    assert reader.state == GpmState.NO_CALLS


def test_a_failed_sample_restarts_the_window(monkeypatch, caplog):
    nvml, handle = h100()
    reader = GpmReader(nvml, handle)
    assert reads(reader, 2)[1]
    real = nvml.nvmlGpmSampleGet

    def busy(device, sample):
        raise pynvml.NVMLError_GpuIsLost()

    monkeypatch.setattr(nvml, "nvmlGpmSampleGet", busy, raising=False)
    assert reads(reader, 2) == [{}, {}]
    monkeypatch.setattr(nvml, "nvmlGpmSampleGet", real, raising=False)
    assert reads(reader, 2)[0] == {}  # never a window spanning the gap
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


# -- MIG -------------------------------------------------------------------------


def mig_fixture(parent_gpm: bool, instance_gpm: bool):
    """The recorded A100 in MIG mode (device 3), given GPM as a Hopper would have it."""
    nvml = FakeNvml()
    nvml.nvmlInit()
    recorded = FakeNvml("nvml_h100_shared.json").devices[0]["gpm"]
    if parent_gpm:
        nvml.devices[3]["gpm"] = recorded
    if instance_gpm:
        nvml.devices[3]["mig"][0]["gpm"] = {"metrics": {"SM_UTIL": {"value": 12.5, "unit": "%"}}}
    return nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(3), 0)


def test_mig_instance_is_sampled_through_its_parent():
    nvml, mig = mig_fixture(parent_gpm=True, instance_gpm=True)
    reader = GpmReader.for_mig(nvml, mig)
    assert reads(reader, 2) == [{}, {"sm_active": 12.5}]  # the instance's own figure, nothing else
    assert nvml.calls_to("nvmlGpmMigSampleGet") == 2 and nvml.calls_to("nvmlGpmSampleGet") == 0


def test_mig_instance_never_gets_the_parents_figures():
    nvml, mig = mig_fixture(parent_gpm=True, instance_gpm=False)  # NVML has nothing for this instance
    assert reads(GpmReader.for_mig(nvml, mig), 3) == [{}] * 3
    nvml, mig = mig_fixture(parent_gpm=False, instance_gpm=False)  # the recorded A100: no GPM at all
    reader = GpmReader.for_mig(nvml, mig)
    assert reads(reader, 3) == [{}] * 3 and reader.unsupported


def test_close_frees_the_samples():
    nvml, handle = h100()
    reader = GpmReader(nvml, handle)
    reads(reader, 2)
    reader.close()
    assert nvml._gpm_samples == {} and reader.read() == {}


def test_fields_are_in_the_data_contract():
    for name in FIELDS:
        assert schema.FIELDS[schema.GPU, name].type is float
    assert {f for _, f in schema.TRACKING["gpm"]} == FIELDS


def test_real_pynvml_has_every_gpm_name():
    names = {"NVML_GPM_METRIC_" + m.gpm for m in METRICS} | {
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
        "nvmlGpmSampleGet",
        "nvmlGpmMigSampleGet",
        "nvmlGpmMetricsGet",
        "c_nvmlGpmMetricsGet_t",
        "NVML_GPM_METRICS_GET_VERSION",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
    }
    assert not sorted(n for n in names if not hasattr(pynvml, n))


class _Worker:
    def __init__(self, visible):
        self.visible, self.pid = visible, 1


def test_gpm_state_is_recorded_per_device_and_said_once_per_reason():
    """Issue 25: a GPU without GPM leaves the fields out and says so once (a named state, as for NVML)."""
    said = []

    def report(what, message, key=None, **details):
        if key not in {k for k, _ in said}:
            said.append((key, message))

    gpm = frozenset((schema.GPU, f) for f in FIELDS)
    a100s = NvmlDevices(gpm, devices="all", nvml=FakeNvml())  # A100s and a K80: no GPM
    uuids = a100s.resolve(_Worker(None))
    found = gpm_found(a100s, uuids, report)
    assert set(found) == set(uuids) and set(found.values()) == {GpmState.UNSUPPORTED.value}
    assert len(said) == 1 and "gives none: unsupported (the device does not support GPM" in said[0][1]

    h100s = NvmlDevices(gpm, nvml=FakeNvml("nvml_h100_shared.json"))
    uuids = h100s.resolve(_Worker("0"))
    assert gpm_found(h100s, uuids, report) == {uuids[0]: "on"} and len(said) == 1
    not_wanted = NvmlDevices(frozenset({(schema.GPU, "utilization_gpu")}), nvml=FakeNvml("nvml_h100_shared.json"))
    assert gpm_found(not_wanted, not_wanted.resolve(_Worker("0")), report) == {}


def test_an_unusual_results_layout_is_read_field_by_field(monkeypatch):
    """The results are unpacked from the structure's bytes only where pynvml lays them out as usual."""
    from dask_influx_metrics.sampling.sources import gpm

    fast = reads(GpmReader(*h100()), 2)[1]
    monkeypatch.setattr(gpm, "_results_layout", lambda nvml: None)
    assert reads(GpmReader(*h100()), 2)[1] == fast and len(fast) == 10
