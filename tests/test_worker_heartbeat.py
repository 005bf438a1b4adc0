"""What a worker adds to its Dask heartbeat (worker/heartbeat.py): its live figures, from its host agent's beat
or its own sampler, with every sink; Dask's own GPU figures where Dask's NVML gives none (this machine)."""

from __future__ import annotations

import socket
import time

import msgpack
import pytest

from dask_influx_metrics import Monitor
from dask_influx_metrics.names import LIVE_METRIC
from dask_influx_metrics.worker.heartbeat import dask_gpu, from_beat, sinks

BUDGET = 1024  # bytes per worker and heartbeat (msgpack, as Dask sends it)


def test_sinks_add_up_agents_and_say_what_is_kept_and_lost():
    counters = [
        {"kind": "udp", "points_sent": 10, "points_dropped": 2, "agent": 5},
        {"kind": "udp", "points_sent": 7, "points_dropped": 1, "agent": 4, "dead": True},
        {"kind": "spool", "points_written": 17, "points_dropped": 0},
        {"kind": "http", "points_written": 5, "points_failed": 4, "points_spooled": 3, "points_refused": 1},
    ]
    assert sinks(counters) == [["http", 5, 4, 1], ["spool", 17, 0, 0], ["udp", 17, 0, 3]]


def test_an_entry_needs_the_agents_figures_of_this_worker():
    assert from_beat(None, "1", "h", 0.0) is None
    assert from_beat({"pid": 1, "samples": 1, "time": 0.0, "live": {"2": {}}}, "1", "h", 0.0) is None
    assert dask_gpu(None) == dask_gpu({"gpus": []}) == {}
    assert dask_gpu({"gpus": [[None, 5, None, None, None, None]]}) == {"gpu_memory_used": 5 << 20}


def _slow(x, delay=2.5):
    time.sleep(delay)
    return x


def _heartbeats(dask_scheduler=None) -> dict:
    return {
        a: {k: ws.metrics.get(k) for k in (LIVE_METRIC, "gpu_utilization", "gpu_memory_used", "gpu-memory-total")}
        for a, ws in dask_scheduler.workers.items()
    }


def wait_for(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := fn()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def _sink_settings(sink: str, request) -> dict:
    if sink == "udp":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a loopback port nothing listens on
            s.bind(("127.0.0.1", 0))
            return {"sink": "udp", "telegraf_address": f"127.0.0.1:{s.getsockname()[1]}"}
    if sink == "http":
        influxd = request.getfixturevalue("influxd")
        return {"sink": "http", "influxdb_url": influxd.url, "database": "heartbeat_test"}
    return {}  # the default: the spool


@pytest.mark.parametrize("mode, sink", [("agent", "spool"), ("agent", "udp"), ("agent", "http"), ("thread", "spool")])
def test_each_worker_carries_its_figures_on_its_heartbeat(client, mode, sink, request, tmp_path):
    monitor = Monitor(
        client,
        gpu_source="simulated",
        gpu_count=2,
        sampler_mode=mode,
        spool_directory=str(tmp_path),
        **_sink_settings(sink, request),
    )
    monitor.attach(polling_interval=100)
    monitor.start()
    try:
        futures = client.map(_slow, range(4))  # both workers, both threads, ~2.5 s
        busy = wait_for(
            lambda: (
                (b := client.run_on_scheduler(_heartbeats))
                # both threads of each worker seen busy (a first heartbeat can come between its two task starts)
                and all(
                    (m[LIVE_METRIC] or {}).get("jobs") == ((1, 2),) and m[LIVE_METRIC]["gpus"][0][0] for m in b.values()
                )
                and b
            )
        )
        assert busy, client.run_on_scheduler(_heartbeats)
        for address, metrics in busy.items():
            entry = metrics[LIVE_METRIC]
            # lists arrive as tuples (Dask's msgpack); key_split drops the leading "_"
            assert entry["jobs"] == ((1, 2),) and entry["prefixes"] == ("slow",), entry
            assert len(entry["gpus"]) == 2, entry
            assert entry["gpus"][0][0] > 50 and entry["gpus"][0][2] == 81920, entry  # util %, total MiB
            host, pid, samples, age = entry["agent"]
            assert host == socket.gethostname() and samples > 0 and 0 <= age < 5, entry
            assert [s[0] for s in entry["sinks"]] == [sink] and len(entry["sinks"][0]) == 4, entry
            assert len(msgpack.packb(entry)) <= BUDGET
            # Dask's GPU charts read these; its own NVML sees no GPU here, so ours fill them
            assert metrics["gpu_utilization"] == entry["gpus"][0][0]
            assert metrics["gpu-memory-total"] == 81920 << 20 and metrics["gpu_memory_used"] >= 400 << 20
        # the sampler's per-job accounting: on one worker of the host (the agent's relay), or each sampling itself
        carriers = wait_for(
            lambda: [
                m[LIVE_METRIC]["acct"]
                for m in client.run_on_scheduler(_heartbeats).values()
                if "acct" in (m[LIVE_METRIC] or {})
            ]
        )
        assert len(carriers) == (1 if mode == "agent" else 2), carriers
        assert all(acct[0][0] == 1 and acct[0][1] > 0 and acct[0][6] >= 1 for acct in carriers), carriers
        client.gather(futures)
    finally:
        monitor.stop()
    gone = wait_for(lambda: all(m[LIVE_METRIC] is None for m in client.run_on_scheduler(_heartbeats).values()))
    assert gone, "the heartbeat entries outlive the session"
    monitor.shutdown()
