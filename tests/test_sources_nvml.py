"""NvmlDevices against recorded NVML output (tests/data/nvml_*.json), no GPU needed."""

from __future__ import annotations

import ast
import logging
import os
import pathlib
import sys

import pynvml
import pytest
from fake_nvml import FakeNvml
from fake_nvml import prices as fake_prices

from dask_influx_metrics.sampling.sources import nvml as nvml_mod
from dask_influx_metrics.sampling.sources import nvml_devices
from dask_influx_metrics.sampling.sources.gpm import FIELDS as GPM_FIELDS
from dask_influx_metrics.sampling.sources.nvml import NvmlDevices, Pace
from dask_influx_metrics.sampling.sources.nvml_devices import nvml_available, parse_visible
from dask_influx_metrics.sampling.sources.slowfields import SLOW, SLOW_FIELDS, SlowFields
from dask_influx_metrics.schema import FIELDS, GPU, Reading

ALL = frozenset(k for k in FIELDS if k[0] == GPU)
PER_SAMPLE = frozenset(k for k in ALL if k[1] not in GPM_FIELDS | SLOW_FIELDS)  # nvml.TABLE's fields
UUID0 = "GPU-9baca7f5-0f2f-01ac-6b05-8da14d6e9005"
UUID1 = "GPU-e1006a74-5836-264f-5c26-53d19d212dfe"
MIG = "MIG-7feb6df5-eccf-5faa-ab00-9a441867e237"
MIB = 2**20


@pytest.fixture
def fake():
    return FakeNvml()


class Worker:
    """What :meth:`NvmlDevices.resolve` needs of a worker: its ``CUDA_VISIBLE_DEVICES``."""

    def __init__(self, visible):
        self.visible = visible


class Source:
    """One worker's GPUs through :class:`NvmlDevices`: ``read()`` gives one reading per device with
    its device-wide and per-worker fields (this process), as the agent writes them for a lone worker."""

    def __init__(self, fields, visible=None, nvml=None, devices="all"):
        self.gpus = NvmlDevices(fields, devices=devices, nvml=nvml)
        self.uuids = self.gpus.resolve(Worker(visible))

    @property
    def devices(self):
        """``(index, uuid, name)`` per device, in the worker's order."""
        return [(i, u, self.gpus.tags(u, i)["name"]) for i, u in enumerate(self.uuids)]

    def read(self):
        self.gpus.start_sample()
        readings = []
        for i, uuid in enumerate(self.uuids):
            fields = {**self.gpus.read(uuid), **self.gpus.read_worker(uuid, frozenset({os.getpid()}))}
            if fields:
                readings.append(Reading(GPU, self.gpus.tags(uuid, i), fields))
        return readings


def by_index(readings):
    return {r.tags["index"]: r for r in readings}


# -- CUDA_VISIBLE_DEVICES ------------------------------------------------------


def test_parse_visible():
    assert parse_visible(None) is None
    assert parse_visible("") == [] and parse_visible(" ") == []
    assert parse_visible("0, 2,") == ["0", "2"]
    assert parse_visible("1,-1,0") == ["1"]  # CUDA stops at a negative index


@pytest.mark.parametrize(
    "visible, uuids",
    [
        (None, [UUID0, UUID1, "GPU-5b2f8e4a-1c7d-9e3f-a6b0-2d4c8f1e7a93", "GPU-1f0c7a2e-3b4d-5e6f-8091-a2b3c4d5e6f7"]),
        ("1,0", [UUID1, UUID0]),
        (f"{UUID1},2", [UUID1, "GPU-5b2f8e4a-1c7d-9e3f-a6b0-2d4c8f1e7a93"]),
        ("GPU-e1006a74", [UUID1]),  # unique prefix, as CUDA accepts
        ("MIG-7feb", [MIG]),
        ("", []),
        ("-1", []),
    ],
)
def test_visible_devices(fake, visible, uuids):
    src = Source(ALL, visible=visible, nvml=fake)
    assert [u for _, u, _ in src.devices] == uuids
    assert [i for i, _, _ in src.devices] == list(range(len(uuids)))  # position, not NVML index
    readings = src.read()
    assert [r.tags["uuid"] for r in readings] == uuids
    assert [r.tags["index"] for r in readings] == [str(i) for i in range(len(uuids))]


def test_one_source_resolves_each_workers_own_visible_devices(fake):
    gpus = NvmlDevices(ALL, devices="all", nvml=fake)
    assert gpus.resolve(Worker("3")) == ["GPU-1f0c7a2e-3b4d-5e6f-8091-a2b3c4d5e6f7"]
    assert gpus.tags("GPU-1f0c7a2e-3b4d-5e6f-8091-a2b3c4d5e6f7", 0)["name"] == "NVIDIA A100-SXM4-80GB"
    assert len(gpus.resolve(Worker(None))) == 4
    assert gpus.resolve(Worker("1,0")) == [UUID1, UUID0]
    assert fake.calls_to("nvmlInit") == 1


def test_gpu_devices_auto_uses_the_first_visible_device_when_the_variable_is_set(fake):
    gpus = NvmlDevices(ALL, nvml=fake)  # gpu.devices: auto
    assert gpus.resolve(Worker("1,0")) == [UUID1]  # dask-cuda: the worker's own GPU first
    assert len(gpus.resolve(Worker(None))) == 4
    assert NvmlDevices(ALL, devices="first", nvml=fake).resolve(Worker(None)) == [UUID0]


def test_nvml_available_reads_the_environment_by_default(fake, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert nvml_available(nvml=fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert not nvml_available(nvml=fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_available(nvml=fake)


@pytest.mark.parametrize(
    "visible, kept, message",
    [
        ("0,foo", 1, "'foo' is neither a GPU index nor a UUID"),
        ("1,7,0", 1, "'7' no GPU with that index"),
        ("GPU-deadbeef", 0, "'GPU-deadbeef' matches no GPU"),
        ("2,GPU-", 1, "'GPU-' is ambiguous"),
        ("0,0,1", 2, None),  # a repeat counts once
        (f"0,{UUID0}", 1, None),
        ("1,-1,0", 1, None),  # -1 ends the list, as in CUDA (parse_visible stops there)
    ],
)
def test_visible_entries_as_cuda_reads_them(fake, visible, kept, message, caplog):
    """Issue 10: CUDA stops at the first entry it cannot use and keeps the devices before it."""
    source = Source(ALL, visible=visible, nvml=fake)
    assert len(source.devices) == kept
    assert nvml_available(nvml=fake, visible=visible) == bool(kept)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if message:
        assert any(message in w and "like CUDA, using only the" in w for w in warnings), warnings
    else:
        assert not warnings


# -- values ----------------------------------------------------------------------


def test_all_fields_follow_schema(fake):
    readings = by_index(Source(ALL, visible=None, nvml=fake).read())
    for r in readings.values():
        assert r.measurement == "gpu" and set(r.tags) == {"index", "nvml_index", "uuid", "name"}  # issue 10: nvml_index
        for name, value in r.fields.items():
            assert type(value) is FIELDS[GPU, name].type, name
    busy = readings["0"].fields
    assert busy == {
        "utilization_gpu": 87.0,
        "utilization_memory": 41.0,
        "memory_used": 24310775808 / MIB,  # v2: reserved memory not counted
        "memory_used_percent": 100 * 24310775808 / 85899345920,
        "memory_total": 81920.0,
        "power_draw": 312.456,
        "temperature_gpu": 61.0,
        "clocks_current_sm": 1410.0,
    }
    assert readings["1"].fields["memory_used"] == pytest.approx(7.797, abs=1e-3)


def test_only_requested_fields_are_read(fake):
    src = Source(frozenset({(GPU, "utilization_gpu"), ("host", "cpu_percent")}), visible="0,1", nvml=fake)
    before = fake.calls.copy()
    assert [r.fields for r in src.read()] == [{"utilization_gpu": 87.0}, {"utilization_gpu": 0.0}]
    delta = fake.calls - before
    assert {f for f, _ in delta} == {"nvmlDeviceGetUtilizationRates"}
    assert fake.calls_to("nvmlDeviceGetUtilizationRates") == 2  # one per device

    src = Source(frozenset({(GPU, "utilization_gpu"), (GPU, "utilization_memory")}), visible="0", nvml=fake)
    before = fake.calls.copy()
    assert src.read()[0].fields == {"utilization_gpu": 87.0, "utilization_memory": 41.0}
    assert sum((fake.calls - before).values()) == 1  # one call serves both


def test_static_memory_total_needs_no_call_per_read(fake):
    src = Source(frozenset({(GPU, "memory_total")}), visible="0", nvml=fake)
    before = fake.calls.copy()
    assert src.read()[0].fields == {"memory_total": 81920.0}
    assert not (fake.calls - before)


def test_no_gpu_fields_no_calls(fake):
    src = Source(frozenset({("host", "cpu_percent")}), visible=None, nvml=fake)
    before = fake.calls.copy()
    assert src.read() == [] and not (fake.calls - before)


# -- errors ----------------------------------------------------------------------


def test_not_supported_is_omitted_and_never_retried(fake, caplog):
    src = Source(ALL, visible="2", nvml=fake)  # the K80: no power reading
    for _ in range(3):
        fields = src.read()[0].fields
        assert "power_draw" not in fields
        assert fields["utilization_gpu"] == 35.0 and fields["temperature_gpu"] == 44.0
    assert fake.calls_to("nvmlDeviceGetPowerUsage") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_memory_v2_falls_back_to_v1_once(fake):
    src = Source(ALL, visible="2", nvml=fake)  # driver 470: no nvmlDeviceGetMemoryInfo_v2
    for _ in range(3):
        fields = src.read()[0].fields
        assert fields["memory_used"] == 3072.0 and fields["memory_total"] == 11996954624 / MIB
    assert fake.calls_to("nvmlDeviceGetMemoryInfo_v2") == 1
    assert fake.calls_to("nvmlDeviceGetMemoryInfo") == 4  # init + 3 reads
    assert fake.calls_to("nvmlDeviceGetTemperatureV") == 1  # same story for temperature
    assert fake.calls_to("nvmlDeviceGetTemperature") == 3


def test_memory_v2_with_pynvml_lacking_version_keyword(fake, monkeypatch):
    v1_only = fake.nvmlDeviceGetMemoryInfo
    monkeypatch.setattr(fake, "nvmlDeviceGetMemoryInfo", lambda handle: v1_only(handle), raising=False)
    fields = Source(ALL, visible="1", nvml=fake).read()[0].fields
    assert fields["memory_used"] == 912.0  # v1 counts reserved memory


def test_mig_instance_has_memory_but_no_utilization(fake, caplog):
    caplog.set_level(logging.INFO, logger=nvml_mod.__name__)
    (reading,) = Source(ALL, visible=MIG, nvml=fake).read()
    assert reading.tags == {"index": "0", "uuid": MIG, "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb"}
    assert reading.fields == {
        "memory_used": 2308.0,
        "memory_total": 42314694656 / MIB,
        "memory_used_percent": 100 * 2420113408 / 42314694656,
    }
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("utilization_gpu/utilization_memory not available" in r.getMessage() for r in caplog.records)


def test_other_error_omits_field_this_sample_reports_once(fake, caplog):
    src = Source(ALL, visible="0,1", nvml=fake)
    fake.devices[1]["power_mw"] = [{"error": "Unknown"}, {"error": "GpuIsLost"}, {"error": "Unknown"}, 60500]
    for _ in range(3):
        first, second = src.read()
        assert "power_draw" in first.fields
        assert "power_draw" not in second.fields and second.fields["utilization_gpu"] == 0.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert f"{UUID1}: reading power_draw" in warnings[0]
    assert src.read()[1].fields["power_draw"] == 60.5  # retried, and back


def test_every_field_failing_drops_only_that_device(fake):
    src = Source(ALL, visible="0,1", nvml=fake)
    for key in ("utilization", "memory_v2", "power_mw", "temperature_v", "clock_sm"):
        fake.devices[0][key] = {"error": "GpuIsLost"}
    src.gpus._devices[UUID0].static.clear()  # memory_total read at open: forget it
    assert [r.tags["index"] for r in src.read()] == ["1"]


def test_result_missing_an_attribute_is_reported_once_and_read_again(fake, caplog):
    fake.devices[0]["utilization"] = [{"gpu": 50}, {"gpu": 60}, {"gpu": 70, "memory": 20}]
    src = Source(ALL, visible="0", nvml=fake)
    first, second, third = (src.read()[0].fields for _ in range(3))
    assert first["utilization_gpu"] == 50.0 and "utilization_memory" not in first  # only that field
    assert first["power_draw"] == 312.456 and "utilization_memory" not in second
    assert third["utilization_gpu"] == 70.0 and third["utilization_memory"] == 20.0  # not switched off
    assert fake.calls_to("nvmlDeviceGetUtilizationRates") == 3
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "utilization_memory" in warnings[0].getMessage()
    assert "AttributeError" in warnings[0].getMessage() and warnings[0].exc_info  # with its traceback


def test_bug_in_a_conversion_is_reported_and_never_switches_the_field_off(fake, monkeypatch, caplog):
    odd = [3]  # three odd results (a typo on their path), then the documented one

    def convert(mw):
        odd[0] -= 1
        return mw.watts if odd[0] >= 0 else mw / 1000.0

    monkeypatch.setitem(nvml_mod.TABLE["power"].fields, "power_draw", convert)
    src = Source(ALL, visible="0", nvml=fake)
    for _ in range(3):
        fields = src.read()[0].fields
        assert "power_draw" not in fields and fields["temperature_gpu"] == 61.0
    assert fake.calls_to("nvmlDeviceGetPowerUsage") == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "power_draw" in warnings[0] and "AttributeError" in warnings[0]
    assert src.read()[0].fields["power_draw"] == 312.456


def test_type_error_from_a_call_is_reported_not_taken_for_unsupported(fake, monkeypatch, caplog):
    real, broken = fake.nvmlDeviceGetClockInfo, [True]

    def clock(handle, type):
        return real(handle) if broken else real(handle, type)  # TypeError while broken

    monkeypatch.setattr(fake, "nvmlDeviceGetClockInfo", clock, raising=False)
    src = Source(ALL - {(GPU, "clocks_current_memory")}, visible="0", nvml=fake)  # one ClockInfo entry
    for _ in range(2):
        assert "clocks_current_sm" not in src.read()[0].fields
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "clocks_current_sm" in warnings[0] and "TypeError" in warnings[0]
    broken.clear()  # the fix
    assert src.read()[0].fields["clocks_current_sm"] == 1410.0


def test_pynvml_without_a_function_or_constant_uses_the_next_variant(fake, monkeypatch, caplog):
    monkeypatch.setattr(fake, "nvmlDeviceGetTemperatureV", None, raising=False)  # as in pynvml < 12
    monkeypatch.setattr(fake, "nvmlMemory_v2", None, raising=False)  # as in pynvml < 11.510
    fields = Source(ALL, visible="0", nvml=fake).read()[0].fields
    assert fields["temperature_gpu"] == 61.0 and fields["memory_used"] == 25258950656 / MIB  # v1
    assert fake.calls_to("nvmlDeviceGetTemperatureV") == fake.calls_to("nvmlDeviceGetMemoryInfo_v2") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_table_covers_exactly_the_schema_gpu_fields():
    """Every gpu field has one reader: TABLE (each sample), SLOW (at most 1/s), GPM, or per-process utilization."""
    in_table = [f for group in nvml_mod.TABLE.values() for f in group.fields]
    slow = [f for group in SLOW.values() for f in group.fields]
    per_process = ["worker_utilization_gpu", "worker_utilization_memory", "worker_gpu_share"]
    assert sorted(in_table + slow + sorted(GPM_FIELDS) + per_process) == sorted(name for _, name in ALL)  # each once


def test_replay_of_a_real_h100_with_two_processes():
    src = Source(PER_SAMPLE, visible=None, nvml=FakeNvml("nvml_h100_shared.json"))
    assert src.devices == [(0, "GPU-da1f6fd4-9109-0cfa-82af-30bfade809cb", "NVIDIA H100 80GB HBM3")]
    samples = [src.read()[0].fields for _ in range(5)]
    assert samples[0] == {
        "utilization_gpu": 99.0,
        "utilization_memory": 30.0,
        "memory_used": 17502.4375,  # v2: 480 MiB reserved not counted
        "memory_total": 81559.0,
        "memory_used_percent": 100 * 18352635904 / 85520809984,
        "power_draw": 694.497,
        "temperature_gpu": 60.0,
        "clocks_current_sm": 1200.0,
        "clocks_event_reasons": 4,  # issue 10: software power cap, as recorded
        "worker_memory_used": 0.0,  # this test process holds nothing on the recorded GPU
        "clocks_current_memory": 2619.0,  # issue 25: Telegraf's clocks_current_memory
        "pstate": 0,  # P0, as nvidia-smi showed
    }  # no encoder/decoder/jpeg/ofa utilization: not recorded, so never written
    assert [s["power_draw"] for s in samples] == [694.497, 698.252, 700.78, 693.983, 700.293]
    assert [s["clocks_current_sm"] for s in samples] == [1200.0, 1410.0, 1305.0, 1380.0, 1365.0]


def test_video_engine_utilization_where_nvml_gives_it(fake):
    """Issue 25: [percent, NVML's period in us] -> percent; a device without the engine leaves the field out."""
    fake.devices[0]["encoder_utilization"] = [[12, 167000]]
    fake.devices[0]["decoder_utilization"] = [[0, 167000], [35, 167000]]
    src = Source(ALL, visible="0,1", nvml=fake)
    first, idle = src.read()
    assert first.fields["utilization_encoder"] == 12.0 and first.fields["utilization_decoder"] == 0.0
    assert not {"utilization_encoder", "utilization_decoder", "utilization_jpeg", "utilization_ofa"} & set(idle.fields)
    assert src.read()[0].fields["utilization_decoder"] == 35.0


def test_table_fields_follow_telegraf_names():
    """Issue 25: where Telegraf's nvidia_smi input has the field with this meaning and unit, the same name."""
    telegraf = {
        "clocks_current_memory",
        "utilization_encoder",
        "utilization_decoder",
        "utilization_jpeg",
        "utilization_ofa",
        "fan_speed",
        "utilization_gpu",
        "utilization_memory",
        "memory_used",
        "memory_total",
        "power_draw",
        "temperature_gpu",
        "clocks_current_sm",
    }
    ours = {name for _, name in ALL}
    assert telegraf <= ours


# -- fields read at most once a second (slowfields.py) -----------------------------


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_energy_every_10_s_at_start_and_at_the_last_sample():
    """Issue 32: total energy costs 3.1-3.7 ms of CPU per call on the H200 (a cumulative counter): read at
    the first sample, every 10 s and at the last (``final``), never repeated; in cost mode the 20 s of
    100 ms samples burn ~3 reads, ~10x less than once a second."""
    nvml = FakeNvml("nvml_h200_shared.json", cost="idle")
    nvml.nvmlInit()
    clock = Clock()
    slow = SlowFields(nvml, nvml.nvmlDeviceGetHandleByIndex(0), SLOW_FIELDS, clock=clock)
    got = []
    for i in range(200):  # 20 s at 100 ms, the last sample final (a worker leaves)
        clock.t = i * 0.1
        got.append(slow.read(final=i == 199))
    read = [i for i, g in enumerate(got) if g]
    assert read == [0, 100, 199], read
    assert all(set(got[i]) == {"total_energy_consumption"} for i in read)  # fan NotSupported, ECC not recorded
    energy = [got[i]["total_energy_consumption"] for i in read]
    assert energy == sorted(energy) and len(set(energy)) == 3, "a counter, as recorded, in mJ"
    assert nvml.charged["nvmlDeviceGetTotalEnergyConsumption"] == 3
    assert nvml.charged["nvmlDeviceGetFanSpeed"] == 1  # NotSupported: never asked again
    assert nvml.burned_us < 4 * fake_prices()["nvmlDeviceGetTotalEnergyConsumption"], "was 20 reads: ~62 ms"


def test_slow_fields_ecc_counters_and_types(fake):
    fake.devices[0]["ecc_errors"] = {"volatile": [3, 0], "aggregate": [17, 1]}
    fake.devices[0]["fan"] = 41
    fake.nvmlInit()
    got = SlowFields(fake, fake.nvmlDeviceGetHandleByIndex(0), SLOW_FIELDS).read()
    assert got == {
        "ecc_errors_volatile_correctable": 3,
        "ecc_errors_volatile_uncorrectable": 0,
        "ecc_errors_aggregate_correctable": 17,
        "ecc_errors_aggregate_uncorrectable": 1,
        "fan_speed": 41.0,
    }  # the A100 recording has no energy reading: left out
    for name, value in got.items():
        assert type(value) is FIELDS[GPU, name].type, name


def test_slow_fields_mig_instance_gets_nothing_of_its_parent(fake):
    fake.devices[3]["energy_mj"] = 123456
    fake.nvmlInit()
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(fake.nvmlDeviceGetHandleByIndex(3), 0)
    assert SlowFields(fake, mig, SLOW_FIELDS).read() == {}


def test_slow_fields_other_errors_skip_one_read(fake, monkeypatch, caplog):
    fake.devices[0]["energy_mj"] = 5
    fake.nvmlInit()
    clock = Clock()
    slow = SlowFields(fake, fake.nvmlDeviceGetHandleByIndex(0), {"total_energy_consumption"}, clock=clock)
    monkeypatch.setitem(fake.devices[0], "energy_mj", {"error": "Unknown"})
    assert slow.read() == {}
    monkeypatch.setitem(fake.devices[0], "energy_mj", 7)
    clock.t = 10.0
    assert slow.read() == {"total_energy_consumption": 7}
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_a_gpu_shared_by_two_workers_is_read_once_per_sample_and_its_memory_split_by_process():
    nvml = FakeNvml("nvml_h100_shared.json")
    gpus = NvmlDevices(PER_SAMPLE, nvml=nvml)
    [uuid] = gpus.resolve(Worker("0"))
    assert gpus.resolve(Worker(uuid)) == [uuid]  # the second worker names it by UUID
    for sample in range(1, 3):
        gpus.start_sample()
        first, second = gpus.read(uuid), gpus.read(uuid)
        mine = gpus.read_worker(uuid, 425), gpus.read_worker(uuid, 427)
        assert first == second and first["utilization_gpu"] == 99.0
        assert [m["worker_memory_used"] for m in mine] == [4909432832 / MIB, 13428064256 / MIB]
        assert nvml.calls_to("nvmlDeviceGetUtilizationRates") == sample  # one call however many readers
        assert nvml.calls_to("nvmlDeviceGetComputeRunningProcesses") == sample


def test_names_as_bytes_from_old_pynvml():
    src = Source(ALL, visible="0", nvml=FakeNvml(as_bytes=True))
    assert src.devices == [(0, UUID0, "NVIDIA A100-SXM4-80GB")]


# -- init, availability, import ----------------------------------------------


def test_init_once_per_process(fake, monkeypatch):
    Source(ALL, visible="0", nvml=fake)
    src = Source(ALL, visible="1", nvml=fake)
    assert nvml_available(nvml=fake, visible=None)
    src.read()
    assert fake.calls_to("nvmlInit") == 1
    monkeypatch.setattr(nvml_devices.os, "getpid", lambda: 999_999_999)  # as in a forked child
    forked = Source(ALL, visible="1", nvml=fake)
    assert forked.read()[0].tags["uuid"] == UUID1
    Source(ALL, visible="0", nvml=fake)
    assert fake.calls_to("nvmlInit") == 2


def test_nvml_available(fake):
    assert nvml_available(nvml=fake, visible=None)
    assert nvml_available(nvml=fake, visible="3")
    assert not nvml_available(nvml=fake, visible="")
    broken = FakeNvml()
    broken.data["init_error"] = "DriverNotLoaded"
    assert not nvml_available(nvml=broken, visible=None)
    with pytest.raises(RuntimeError, match="NVML could not start"):
        NvmlDevices(ALL, nvml=broken)


@pytest.mark.skipif(nvml_available(visible=None), reason="this machine has a GPU")
def test_real_pynvml_without_gpu():
    assert not nvml_available(nvml=pynvml, visible=None)
    with pytest.raises(RuntimeError, match="NVML could not start"):
        NvmlDevices(ALL, nvml=pynvml)


def test_missing_pynvml_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(ImportError, match="pip install nvidia-ml-py"):
        NvmlDevices(ALL)
    assert not nvml_available()


def test_handles_and_close(fake):
    src = Source(ALL, visible="1,MIG-7feb", nvml=fake)
    assert [src.gpus.handle(u) for u in src.uuids] == [(1, None), (3, 0)]
    src.gpus.close()
    with pytest.raises(KeyError):
        src.gpus.handle(src.uuids[0])


# -- the real pynvml has every name nvml.py uses ------------------------------------


def nvml_names_used() -> set[str]:
    """``nvml.X`` attributes and ``getattr(nvml, "X", ...)`` names in sampling/sources/nvml*.py (and the
    GPM, per-process and slow-field modules), and every name the calls in ``nvml.TABLE``/``SLOW`` need."""
    groups = [*nvml_mod.TABLE.values(), *SLOW.values()]
    names = {n for group in groups for call in group.calls for n in call.names()}
    here = pathlib.Path(nvml_mod.__file__).parent
    for path in [*here.glob("nvml*.py"), here / "gpm.py", here / "procutil.py", here / "slowfields.py"]:
        names |= names_in(ast.parse(path.read_text()))
    return names


def names_in(tree) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "nvml":
            names.add(node.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "nvml"
            and isinstance(node.args[1], ast.Constant)  # a variable name: its values are in TABLE
        ):
            names.add(node.args[1].value)
    return names


def test_real_pynvml_has_every_name_used():
    names = nvml_names_used()
    assert {"nvmlInit", "nvmlDeviceGetMemoryInfo", "nvmlMemory_v2", "NVMLError_NotSupported"} <= names
    missing = sorted(n for n in names if not hasattr(pynvml, n))
    assert not missing, f"not in the installed pynvml: {missing}"


def test_real_memory_info_takes_version_keyword():
    import inspect

    assert "version" in inspect.signature(pynvml.nvmlDeviceGetMemoryInfo).parameters
    assert "version" in inspect.signature(FakeNvml().nvmlDeviceGetMemoryInfo).parameters


def test_gpm_and_slow_fields_join_the_device_reading():
    """Issue 25: the device's GPM metrics (from its second sample on) and its slow fields (at most once a
    second) come with its per-sample fields; the MIG-free H100 replay has GPM, the energy counter."""
    gpus = NvmlDevices(ALL, nvml=FakeNvml("nvml_h100_shared.json"), pace=Pace(interval_s=0.2))
    [uuid] = gpus.resolve(Worker("0"))
    reads = []
    for _ in range(3):
        gpus.start_sample()
        reads.append(gpus.read(uuid))
    assert "sm_active" not in reads[0] and "total_energy_consumption" in reads[0]
    assert round(reads[1]["sm_occupancy"], 1) == 14.2 and reads[1]["utilization_gpu"] == 99.0
    assert "total_energy_consumption" not in reads[1], "read at most once a second"
