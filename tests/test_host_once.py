"""sampler.host-once (the default) on a real LocalCluster: 2 worker processes of one host write one host
series, tagged with the jobs of both workers; when its writer exits, the other worker takes over.
In-process samplers and sidecars (sampler.isolate) alike."""

from __future__ import annotations

import threading
import time

import pytest

from dask_influx_metrics import Monitor, query


def hold(seconds: float) -> int:
    threading.Event().wait(seconds)  # a task that runs a while without using the CPU
    return 1


def _poll(what, deadline: float, pause: float = 0.2):
    """``what()`` until it returns something other than None/False or ``deadline`` (monotonic) passes;
    returns its last answer."""
    while True:
        got = what()
        if (got is not None and got is not False) or time.monotonic() > deadline:
            return got
        threading.Event().wait(pause)


def _host_points(spool: str):
    """The host series of the one host in the spool, or None while there is none yet."""
    try:
        with query.connect(spool) as db:
            host, = set(db.hosts().values()) or {None}
            series = db.host_series(host, ["cpu_percent"]) if host else None
    except query.QueryError:  # nothing spooled yet
        return None
    return None if series is None or series.empty else series


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "sidecar"])
def test_two_clients_jobs_on_two_workers_tag_the_one_host_series(tmp_path, isolate):
    from distributed import Client, LocalCluster

    spool = str(tmp_path / "spool")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as first:
        monitor = Monitor(first, sink="spool", spool_directory=spool, gpu_source="none", isolate=isolate,
                          flush_interval=0.2)
        monitor.attach(polling_interval=50)
        monitor.start()
        try:
            w0, w1 = sorted(first.scheduler_info()["workers"])
            with Client(cluster.scheduler_address) as second:  # job_type client: each client is a job
                a = first.submit(hold, 1.5, workers=[w0], pure=False)
                b = second.submit(hold, 1.5, workers=[w1], pure=False)
                assert a.result() + b.result() == 2
            with query.connect(spool) as db:
                series = _poll(lambda: _host_points(spool), time.monotonic() + 20)
                writer, = set(series["worker"])
                assert set(db.hosts()) == {w0, w1} and len(set(db.hosts().values())) == 1
                both = series[series["job"] == "1,2"]
                assert len(both) and both["dag"].str.count(",").eq(1).all(), \
                    "while both jobs ran, each on its own worker, the host's readings belong to both"
                tables = db.worker_tables(metrics=["host-cpu", "tasks"])
                for w, table in tables.items():
                    assert "1,2" not in set(table["job"]), "a worker's own rows keep its own job"
                    assert table["host-cpu"].notna().mean() > 0.8, w
            # the writer leaves: the other worker takes over at its next sample
            other = w1 if writer == w0 else w0
            left = time.time_ns()
            first.retire_workers([writer], close_workers=True)
            taken = _poll(lambda: (lambda s: s is not None and bool((s[s["time"] > left]["worker"] == other).any()))(
                _host_points(spool)), time.monotonic() + 30)
            assert taken, "the remaining worker writes the host after the writer exited"
        finally:
            monitor.stop()
            monitor.shutdown()
