"""build_sampler: the one wiring of sources, sink and tags for the worker plugin and the sidecar."""

import os

import psutil

from dask_influx_metrics import custom_metric
from dask_influx_metrics.config import Settings
from dask_influx_metrics.worker.build import build_sampler
from dask_influx_metrics.sinks.spool import read_lines
from dask_influx_metrics.worker.sources.activity import CachedActivity, TaskRegistry
from dask_influx_metrics.worker.sources.simulated import simulated_uuid

BASE = {"host": "h", "worker": "tcp://w:1"}


def build(tmp_path, gpu_source="simulated", reports=None, **kwargs):
    settings = Settings.resolve({"sink": "spool", "spool.directory": str(tmp_path), "gpu.source": gpu_source,
                                 "gpu.count": 2, "tracking": ["compute-util", "host-cpu", "worker-mem", "tasks"]})
    registry = TaskRegistry(nthreads=2)
    registry.started("x", job=3, dag=7)
    report = (lambda what, message: reports.append((what, message))) if reports is not None else print
    session = f"test-build-{os.getpid()}-{tmp_path.name}"  # own host lock: the host is written once per session
    return build_sampler(settings, session, "tcp://w:1", BASE, CachedActivity(registry),
                         clock_offset=lambda: 0.0, report=report, **kwargs)


def by_measurement(points):
    out = {}
    for p in points:
        out.setdefault(p.measurement, []).append(p)
    return out


def test_every_source_tagged_with_the_snapshot(tmp_path):
    sampler, parts = build(tmp_path, custom=[custom_metric("one", per_device=False)(lambda w, hs: len(hs))],
                           worker="the worker")
    points = by_measurement(sampler.sample())
    assert sorted(points) == ["custom", "gpu", "host", "worker"]
    assert all(p.tags.items() >= {**BASE, "job": "3", "dag": "7"}.items() for ps in points.values() for p in ps)
    assert [p.tags["uuid"] for p in points["gpu"]] == [simulated_uuid(0), simulated_uuid(1)]
    assert points["custom"][0].fields == {"one": 2.0}  # the GPU source's handles
    assert points["worker"][0].fields["running"]
    sampler.sample_and_send()
    parts.sink.close()
    assert any(line.startswith(b"gpu,") for line in read_lines(str(tmp_path)))


def test_custom_only_opens_the_gpu_only_for_per_device_metrics(tmp_path):
    whole = custom_metric("whole", per_device=False)(lambda w, hs: 1.0)
    sampler, parts = build(tmp_path, custom=[whole], worker=None, custom_only=True)
    assert parts.gpu is None and [p.measurement for p in sampler.sample()] == ["custom"]
    per_device = custom_metric("device-number", per_device=True)(lambda w, h: h.index)
    sampler, parts = build(tmp_path, custom=[per_device], worker=None, custom_only=True, sink=parts.sink)
    points = sampler.sample()
    assert parts.gpu is not None and {p.measurement for p in points} == {"custom"}
    assert sorted((p.tags["index"], p.fields["device-number"]) for p in points) == [("0", 0.0), ("1", 1.0)]
    again, reused = build(tmp_path, gpu=parts.gpu, sink=parts.sink)  # the sidecar died: a full sampler
    assert reused == parts and {p.measurement for p in again.sample()} >= {"gpu", "host"}
    parts.sink.close()


def test_udp_sends_keep_the_gil_in_the_worker_process_only(tmp_path):
    settings = Settings.resolve({"sink": "udp", "gpu.source": "none"})
    for process, held in [(None, True), (psutil.Process(os.getppid()), False)]:
        _, parts = build_sampler(settings, f"test-held-{os.getpid()}", "tcp://w:1", BASE,
                                 CachedActivity(TaskRegistry(nthreads=1)), clock_offset=lambda: 0.0, report=print,
                                 process=process)
        assert parts.sink.hold_gil is held  # a sidecar (process given) has no task threads to lose the GIL to
        parts.sink.close()


def test_sidecar_samples_the_worker_process(tmp_path):
    worker = psutil.Process(os.getppid())
    sampler, parts = build(tmp_path, process=worker)
    points = by_measurement(sampler.sample())
    assert "custom" not in points
    assert [p.tags["uuid"] for p in points["gpu"]] == [simulated_uuid(0, pid=worker.pid), simulated_uuid(1, pid=worker.pid)]
    rss = points["worker"][0].fields["rss"]
    assert abs(rss - worker.memory_info().rss) < abs(rss - psutil.Process().memory_info().rss)  # not ours
    parts.sink.close()


def test_gpu_source_that_cannot_start_is_reported_and_the_rest_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "bogus")
    reports = []
    sampler, parts = build(tmp_path, gpu_source="nvml", reports=reports)
    assert parts.gpu is None
    [(what, message)] = reports
    assert what == "gpu-source" and message.startswith("GPU source 'nvml' unavailable: ")
    assert "'bogus' is neither" in message or "NVML could not start" in message  # with a GPU / without
    assert {p.measurement for p in sampler.sample()} == {"host", "worker"}
    parts.sink.close()


def test_host_once_lets_one_sampler_per_host_write_the_host(tmp_path):
    settings = Settings.resolve({"sink": "spool", "spool.directory": str(tmp_path), "gpu.source": "none",
                                 "tracking": ["host-cpu", "worker-mem"]})
    assert settings.host_once, "the default"
    session = f"test-build-once-{os.getpid()}-{tmp_path.name}"
    one, two = (build_sampler(settings, session, f"tcp://w:{i}", BASE, CachedActivity(TaskRegistry()),
                              clock_offset=lambda: 0.0, report=print) for i in (1, 2))
    assert [{p.measurement for p in s.sample()} for s, _ in (one, two)] == [{"host", "worker"}, {"worker"}]
    one[0].stop()  # releases the lock: the other takes over
    assert {p.measurement for p in two[0].sample()} == {"host", "worker"}
    two[0].stop()
    for _, parts in (one, two):
        parts.sink.close()


def test_the_host_point_carries_the_jobs_of_every_worker_of_the_host(tmp_path):
    """Two samplers of one host (and session): the host's writer tags its point with both workers' jobs,
    whatever GPU source; each worker's own points keep its own tags. Idle: dag 0, the writer's last job."""
    settings = Settings.resolve({"sink": "spool", "spool.directory": str(tmp_path), "gpu.source": "simulated",
                                 "tracking": ["host-cpu", "worker-mem", "compute-util"]})
    session = f"test-build-union-{os.getpid()}-{tmp_path.name}"
    registries = [TaskRegistry(), TaskRegistry()]
    (one, p1), (two, p2) = (build_sampler(settings, session, f"tcp://w:{i}", {**BASE, "worker": f"tcp://w:{i}"},
                                          CachedActivity(r), clock_offset=lambda: 0.0, report=print)
                            for i, r in enumerate(registries))
    registries[0].started("a", job=1, dag=1)
    assert {p.measurement for p in one.sample()} == {"host", "worker", "gpu"}, "the first to sample writes the host"
    registries[0].finished("a")
    registries[1].started("b", job=2, dag=5)
    two.sample()  # publishes: the other worker runs job 2
    host, = [p for p in one.sample() if p.measurement == "host"]
    assert (host.tags["job"], host.tags["dag"]) == ("2", "5"), "job 2 runs on the host; the writer is idle"
    assert all((p.tags["job"], p.tags["dag"]) == ("1", "0") for p in one.sample() if p.measurement != "host"), \
        "the writer's own points: its own (idle) tags"
    registries[0].started("c", job=3, dag=6)
    host, = [p for p in one.sample() if p.measurement == "host"]
    assert (host.tags["job"], host.tags["dag"]) == ("2,3", "5,6")
    registries[0].finished("c"), registries[1].finished("b")
    two.sample()
    host, = [p for p in one.sample() if p.measurement == "host"]
    assert (host.tags["job"], host.tags["dag"]) == ("3", "0"), "idle: the writer's last job, dag 0"
    one.stop()
    registries[1].started("d", job=4, dag=9)
    host, = [p for p in two.sample() if p.measurement == "host"]
    assert (host.tags["job"], host.tags["dag"]) == ("4", "9"), "the writer left: the other took over, alone now"
    two.stop()
    for parts in (p1, p2):
        parts.sink.close()


def test_with_only_host_metrics_tracked_every_worker_writes_its_host(tmp_path):
    """Nothing else of its own to write: host-once would leave the other workers without a row."""
    settings = Settings.resolve({"sink": "spool", "spool.directory": str(tmp_path), "gpu.source": "none",
                                 "tracking": ["host-cpu"]})
    session = f"test-build-hostonly-{os.getpid()}-{tmp_path.name}"
    built = [build_sampler(settings, session, f"tcp://w:{i}", BASE, CachedActivity(TaskRegistry()),
                           clock_offset=lambda: 0.0, report=print) for i in (1, 2)]
    assert [{p.measurement for p in s.sample()} for s, _ in built] == [{"host"}, {"host"}]
    for s, parts in built:
        s.stop()
        parts.sink.close()
