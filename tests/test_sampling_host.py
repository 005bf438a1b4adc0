"""The host-sampling core (issue 46 item 1): what the agent builds for its host's workers and a worker in
thread mode for itself alone, from the settings: GPUs, sources, collector, accounting, live figures, sink,
sender, sampler."""

import os

from polling import wait_until

from dask_influx_metrics import lineparse
from dask_influx_metrics.config import Settings
from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.sampling.host import HostSampling
from dask_influx_metrics.sampling.view import WorkerView
from dask_influx_metrics.sinks.paths import spool_dir
from dask_influx_metrics.sinks.spool import read_lines

SESSION = "20261128T000000-1-abcdef"


def settings_for(tmp_path, **more):
    return Settings.resolve(
        {
            "gpu.source": "simulated",
            "gpu.count": 2,
            "sink": "spool",
            "spool.directory": str(tmp_path),
            "polling-interval": 50,
            "tracking": ["compute-util", "total-mem", "host-cpu", "worker-cpu", "accounting"],
            **more,
        }
    )


def view_of_this_process(settings, running=((("t", 0), 3, 7),)):
    snapshot = Snapshot(running, 1, 0, 3)
    info = {"address": "tcp://w:1", "pid": os.getpid(), "tags": {"host": "h", "worker": "tcp://w:1"}, "visible": "1,0"}
    return WorkerView("self", info, lambda: snapshot, settings.fields, offset=lambda: 0.0)


def written(settings, role):
    return [lineparse.parse(line) for line in read_lines(spool_dir(settings, SESSION, role))]


def test_one_core_samples_its_views_gpus_host_and_process_and_sends_them_through_its_sink(tmp_path):
    settings, events = settings_for(tmp_path), []
    views = []
    core = HostSampling(
        settings,
        {"worker": "tcp://w:1", "session": SESSION},
        lambda what, message, **d: events.append(what),
        lambda now_ns: core.sample(views, now_ns),
        name="test-core",
    )
    views.append(view_of_this_process(settings))
    found, state = core.found(views[0])
    assert state.value == "simulated" and found["devices"] == views[0].uuids and len(views[0].uuids) == 2
    core.sampler.start()
    wait_until(lambda: core.sampler.samples >= 3, what="three samples")
    core.stop(final_sample=True)
    core.close()
    points = written(settings, "tcp://w:1")
    kinds = {p.measurement for p in points}
    assert {"gpu", "host", "worker", "accounting", "delivery"} <= kinds, kinds
    gpus = [p for p in points if p.measurement == "gpu"]
    assert {(p.tags["job"], p.tags["dag"]) for p in gpus} == {("3", "7")}, "the view's own job and DAG"
    assert {p.tags["uuid"] for p in gpus} == set(views[0].uuids)
    assert core.figures.entries["self"], "the live figures of the view"
    assert points[-1].measurement == "delivery", "the last counts come last, after the final totals"
