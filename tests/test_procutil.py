"""Per-process utilization replayed from the shared H100 (matmul pid 425, holder pid 427), and its mapping to workers."""

from __future__ import annotations

import logging

import pynvml
import pytest
from fake_nvml import FakeNvml

from dask_influx_metrics import schema
from dask_influx_metrics.sampling.sources.procutil import ProcessUtilization, worker_utilization

MATMUL, HOLDER = 425, 427


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def h100(phase=None, drop=()):
    nvml = FakeNvml("nvml_h100_shared.json", phase=phase)
    for name in drop:  # as a driver/pynvml without this call
        setattr(nvml, name, None)
    nvml.nvmlInit()
    return nvml, nvml.nvmlDeviceGetHandleByIndex(0)


def windows(reader, clock, n, step=1.0):
    out = []
    for _ in range(n):
        out.append(reader.read())
        clock.t += step
    return out


@pytest.mark.parametrize(
    "drop, used",
    [
        ((), "nvmlDeviceGetProcessesUtilizationInfo"),
        (("nvmlDeviceGetProcessesUtilizationInfo",), "nvmlDeviceGetProcessUtilization"),
    ],
)
def test_matmul_gets_the_sm_time_and_the_holder_none(drop, used):
    nvml, handle = h100(drop=drop)
    clock = Clock()
    got = windows(ProcessUtilization(nvml, handle, clock=clock), clock, 5)
    assert got[0] is None  # timestamp 0: the driver's buffer, stale (the holder's sample is 11 s old)
    for window in got[1:]:
        shares = worker_utilization(window, {"matmul": {MATMUL}, "holder": {HOLDER}})
        assert shares["matmul"][0] >= 95 and shares["holder"][0] <= 2
        assert 25 <= shares["matmul"][1] <= 40  # memory-controller share, as recorded (31-33 %)
    assert nvml.calls_to(used) == 5


def test_last_seen_timestamp_is_passed_and_never_zero_again(monkeypatch):
    nvml, handle = h100()
    seen = []
    real = nvml.nvmlDeviceGetProcessesUtilizationInfo
    monkeypatch.setattr(
        nvml, "nvmlDeviceGetProcessesUtilizationInfo", lambda h, ts: seen.append(ts) or real(h, ts), raising=False
    )
    clock = Clock()
    windows(ProcessUtilization(nvml, handle, clock=clock), clock, 5)
    recorded = [
        s["processes_utilization_info_arg"]
        for s in FakeNvml("nvml_h100_shared.json").data["phases"]["shared"]["samples"]
    ]
    assert seen == recorded  # the recorder's own arguments: newest timestamp of the previous answer
    assert seen[0] == 0 and all(seen[1:])


def test_empty_first_answer_starts_the_window_at_now():
    nvml, handle = h100("idle")  # NotFound: nobody ran a kernel
    clock, wall = Clock(), 1795422959.5
    reader = ProcessUtilization(nvml, handle, clock=clock, wall=lambda: wall)
    assert reader.read() is None
    assert reader._last_seen == int(wall * 1e6)
    clock.t = 1.0
    assert reader.read() == {}  # a window in which nobody ran: every worker 0
    assert worker_utilization({}, {"w": {1, 2}}) == {"w": (0.0, 0.0)}


def test_processes_that_exited_read_as_zero():
    nvml, handle = h100("after")
    clock = Clock()
    assert windows(ProcessUtilization(nvml, handle, clock=clock), clock, 3) == [None, {}, {}]


def test_read_at_most_once_a_second_unless_forced():
    nvml, handle = h100()
    clock = Clock()
    reader = ProcessUtilization(nvml, handle, clock=clock)
    reader.read()
    got = windows(reader, clock, 30, step=0.05)  # a 50 ms sampler for 1.5 s
    assert [i for i, g in enumerate(got) if g is not None] in ([20], [21])  # once, a second after the first
    assert nvml.calls_to("nvmlDeviceGetProcessesUtilizationInfo") == 2
    assert reader.read(force=True) is not None
    assert nvml.calls_to("nvmlDeviceGetProcessesUtilizationInfo") == 3


def test_several_samples_of_one_process_are_averaged():
    nvml, handle = h100()
    nvml.devices[0]["processes_utilization_info"] = [
        [{"timeStamp": 10, "pid": 1, "smUtil": 0, "memUtil": 0}],
        [
            {"timeStamp": 20, "pid": 1, "smUtil": 50, "memUtil": 10},
            {"timeStamp": 30, "pid": 1, "smUtil": 100, "memUtil": 20},
            {"timeStamp": 30, "pid": 2, "smUtil": 4, "memUtil": 0},
        ],
    ]
    clock = Clock()
    assert windows(ProcessUtilization(nvml, handle, clock=clock), clock, 2)[1] == {1: (75.0, 15.0), 2: (4.0, 0.0)}


def test_mig_instance_gets_no_utilization_from_its_parent(caplog):
    """NVML has no per-process utilization for a MIG instance: none, even when the parent has some."""
    nvml = FakeNvml()
    nvml.nvmlInit()
    parent = nvml.nvmlDeviceGetHandleByIndex(3)
    nvml.devices[3]["processes_utilization_info"] = [[{"timeStamp": 5, "pid": 1, "smUtil": 90, "memUtil": 9}]]
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    clock = Clock()
    with caplog.at_level(logging.INFO):
        reader = ProcessUtilization(nvml, mig, clock=clock, label="MIG 0")
        assert windows(reader, clock, 3) == [None, None, None]
    assert not reader.supported
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "MIG 0: no per-process utilization" in said[0]


def test_other_nvml_errors_skip_one_window(monkeypatch, caplog):
    nvml, handle = h100()
    clock = Clock()
    reader = ProcessUtilization(nvml, handle, clock=clock)
    windows(reader, clock, 2)

    def lost(h, ts):
        raise pynvml.NVMLError_GpuIsLost()

    real = nvml.nvmlDeviceGetProcessesUtilizationInfo
    monkeypatch.setattr(reader, "_calls", [lost])
    assert windows(reader, clock, 2) == [None, None]
    monkeypatch.setattr(reader, "_calls", [real])
    assert windows(reader, clock, 1)[0][MATMUL][0] == 99
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_worker_utilization_sums_a_process_tree_and_charges_no_stranger():
    per_pid = {10: (40.0, 5.0), 11: (30.0, 3.0), 99: (20.0, 1.0)}
    assert worker_utilization(per_pid, {"a": [10, 11, 12], "b": {13}}) == {"a": (70.0, 8.0), "b": (0.0, 0.0)}


def test_fields_are_in_the_data_contract():
    assert set(schema.TRACKING["worker-gpu-util"]) == {
        (schema.GPU, "worker_utilization_gpu"),
        (schema.GPU, "worker_utilization_memory"),
        (schema.GPU, "worker_gpu_share"),
    }
