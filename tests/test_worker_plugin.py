"""The worker plugin on a real LocalCluster: teardown and the sidecar's liveness under faults."""

import asyncio
import socket
import threading
import time

from distributed import Client, LocalCluster
from distributed.core import rpc

from dask_influx_metrics import Monitor


def round_trip(address: str) -> float:
    """Seconds for one ``identity`` call straight to ``address`` (a fresh connection each time)."""
    async def call():
        async with rpc(address) as remote:
            await remote.identity()

    started = time.monotonic()
    asyncio.run(call())
    return time.monotonic() - started


def worst_round_trips(addresses, busy: threading.Event) -> dict:
    """Each address's slowest round trip while ``busy`` is set (at least one each)."""
    worst = dict.fromkeys(addresses, 0.0)
    while True:
        for a in addresses:
            worst[a] = max(worst[a], round_trip(a))
        if not busy.is_set():
            return worst


def test_teardown_with_a_frozen_influxdb_never_blocks_the_event_loops(tmp_path):
    # a server that accepts connections and never answers: every write hangs until its timeout
    with socket.create_server(("127.0.0.1", 0), backlog=128) as frozen, \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        url = "http://127.0.0.1:%d" % frozen.getsockname()[1]
        monitor = Monitor(client, sink="http", influxdb_url=url, spool_directory=str(tmp_path),
                          gpu_source="simulated", http_timeout=3)
        monitor.attach(polling_interval=50)
        monitor.start()
        [worker] = client.scheduler_info()["workers"]
        assert client.submit(sum, [1, 2]).result() == 3  # dag points for the scheduler's sink
        threading.Event().wait(1.5)  # the first batches (1 s) are posted and hang
        busy = threading.Event()
        busy.set()
        stopping = threading.Thread(target=lambda: (monitor.stop(), busy.clear()))
        started = time.monotonic()
        stopping.start()
        worst = worst_round_trips([worker, cluster.scheduler_address], busy)
        stopping.join()
        took = time.monotonic() - started
        monitor.shutdown()
    print(f"stop() took {took:.2f} s; slowest round trips: worker {worst[worker] * 1000:.0f} ms, "
          f"scheduler {worst[cluster.scheduler_address] * 1000:.0f} ms")
    assert took > 1.0  # the frozen writes really were waited for (bounded), off the loops
    assert worst[worker] < 0.5 and worst[cluster.scheduler_address] < 0.5


def sampler_counts(dask_worker) -> tuple[int, int]:
    sampler = dask_worker.plugins["influx-metrics"].sampler
    return sampler.samples, sampler.extra


def test_an_extra_sample_for_a_graph_after_idleness_not_between_back_to_back_short_tasks():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        receiver.bind(("127.0.0.1", 0))
        monitor = Monitor(client, sink="udp", telegraf_address="127.0.0.1:%d" % receiver.getsockname()[1],
                          gpu_source="simulated")
        monitor.attach(polling_interval=500)
        monitor.start()
        try:
            time.sleep(0.6)  # a tick or two with the worker idle
            assert client.submit(sum, [1, 2], pure=False).result() == 3
            deadline = time.monotonic() + 10
            while [extra for _, extra in client.run(sampler_counts).values()] == [0] and time.monotonic() < deadline:
                time.sleep(0.05)
            [(samples, extra)] = client.run(sampler_counts).values()
            assert extra == 1, "a task on a worker its last sample saw idle gets a sample at once"
            time.sleep(0.6)  # idle again at the next tick
            end = time.monotonic() + 2.5
            while time.monotonic() < end:  # short tasks back to back for 5 intervals
                client.gather(client.map(abs, range(-200, 0), pure=False))
            [(samples_after, extra_after)] = client.run(sampler_counts).values()
        finally:
            monitor.shutdown()
    assert samples_after - samples >= 5
    assert extra_after - extra <= 1, "at most the first of the back-to-back tasks wakes the sampler"
