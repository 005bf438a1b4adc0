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
