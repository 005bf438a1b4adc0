"""The accounting rules (docs/attribution.md, "Accounting") on hand-made samples: windows, shares, energy,
memory, CPU, conservation, and when points are written."""

from __future__ import annotations

import json

import pytest

from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.sampling import accounting as A
from dask_influx_metrics.schema import ACCOUNTING, IDLE_JOB

STEP = 0.2  # s, the polling interval
NS = 1_000_000_000
SHARE = "worker_gpu_share"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def snap(*jobs):
    """A worker's snapshot running one task per job listed (0: a task of no job)."""
    return Snapshot(tuple(((f"k{i}", 0), job, 1) for i, job in enumerate(jobs)), 4, 0, jobs[-1] if jobs else 0)


IDLE = snap()


def make(interval=10.0, retention=300.0):
    clock = Clock()
    said = []
    acc = A.Accounting(
        interval,
        STEP,
        {"host": "h", "worker": "agent-h"},
        retention_s=retention,
        since_ns=0,
        clock=clock,
        report=lambda what, message, key=None: said.append(message),
    )
    return acc, clock, said


def run(acc, clock, samples, start=0):
    """``samples``: per step, ``(gpus, workers)`` as Accounting.update takes them; one every STEP s."""
    points = []
    for k, (gpus, workers, *final) in enumerate(samples, start):
        clock.t = k * STEP
        points += acc.update(int(k * STEP * NS), int(k * STEP * NS), gpus, workers, final=bool(final))
    return points


def gpu(uuid="GPU-a", users=(("w1", {}),), **device):
    return (uuid, device, {"index": "0", "uuid": uuid, "nvml_index": "0"}, list(users))


def worker(wid="w1", s=IDLE, cpu=None):
    return (wid, f"tcp://{wid}:1", s, {} if cpu is None else {"cpu_percent": cpu})


def totals(acc, job, uuid="GPU-a") -> dict:
    live = acc.live()
    entry = live["idle"] if job == IDLE_JOB else live["jobs"].get(str(job), {"gpus": {}})
    return entry["gpus"].get(uuid, {})


def test_a_jobs_window_is_its_readings_time_and_idle_windows_are_nobodys():
    acc, clock, _ = make()
    busy, idle = snap(3), IDLE
    samples = [([gpu(utilization_gpu=50.0)], [worker(s=busy)])] * 5 + [
        ([gpu(utilization_gpu=10.0)], [worker(s=idle)])
    ] * 5
    run(acc, clock, samples)
    job = totals(acc, 3)
    assert job["gpu_seconds"] == pytest.approx(5 * STEP) and job["busy_seconds"] == pytest.approx(0.5 * 5 * STEP)
    nobody = totals(acc, IDLE_JOB)
    assert nobody["gpu_seconds"] == pytest.approx(5 * STEP) and nobody["busy_seconds"] == pytest.approx(0.1 * 5 * STEP)


def test_a_gap_is_capped_at_three_steps_and_the_first_window_is_one_step():
    acc, clock, _ = make()
    acc.update(0, 0, [gpu(utilization_gpu=100.0)], [worker(s=snap(1))])
    acc.update(10 * NS, 10 * NS, [gpu(utilization_gpu=100.0)], [worker(s=snap(1))])  # a frozen sampler
    assert totals(acc, 1)["busy_seconds"] == pytest.approx(STEP + A.CAP_STEPS * STEP)


def test_jobs_sharing_a_worker_split_its_share_by_their_tasks_and_job_0_is_idle():
    acc, clock, _ = make()
    run(acc, clock, [([gpu(utilization_gpu=90.0)], [worker(s=snap(1, 1, 2, 0))])] * 10)
    seconds = 10 * STEP * 0.9
    assert totals(acc, 1)["busy_seconds"] == pytest.approx(seconds / 2)
    assert totals(acc, 2)["busy_seconds"] == pytest.approx(seconds / 4)
    assert totals(acc, IDLE_JOB)["busy_seconds"] == pytest.approx(seconds / 4)  # the task of no job
    assert totals(acc, 1)["gpu_seconds"] == totals(acc, 2)["gpu_seconds"] == pytest.approx(10 * STEP)


def test_on_a_shared_gpu_windows_wait_for_the_share_that_covers_them():
    """Two workers on one GPU; the per-process share comes once a second (every 5th sample): the windows
    before it take it, not the one before (shares that start with the work)."""
    acc, clock, _ = make()
    samples = []
    for k in range(10):
        answer = k in (4, 9)
        a = {"worker_gpu_share": 90.0} if answer else {}
        b = {"worker_gpu_share": 10.0} if answer else {}
        samples.append(
            ([gpu(users=[("a", a), ("b", b)], utilization_gpu=100.0)], [worker("a", snap(1)), worker("b", snap(2))])
        )
    run(acc, clock, samples[:3])
    assert totals(acc, 1) == {}, "nothing is charged before the share of the window is known"
    run(acc, clock, samples[3:], start=3)
    assert totals(acc, 1)["busy_seconds"] == pytest.approx(0.9 * 10 * STEP)
    assert totals(acc, 2)["busy_seconds"] == pytest.approx(0.1 * 10 * STEP)


def test_a_share_that_never_comes_is_idle_after_the_wait_and_said_once():
    acc, clock, said = make()
    samples = [
        ([gpu(users=[("a", {}), ("b", {})], utilization_gpu=100.0)], [worker("a", snap(1)), worker("b", snap(2))])
    ]
    run(acc, clock, samples * int(A.WAIT_S / STEP + 5))
    assert totals(acc, 1).get("busy_seconds", 0.0) == 0.0
    assert totals(acc, IDLE_JOB)["busy_seconds"] > 0.9 * 5 * STEP
    assert len(said) == 1 and "no per-process share" in said[0]


def test_energy_is_the_counters_delta_split_by_power_times_time_and_jobs_plus_idle_conserve_it():
    acc, clock, _ = make()
    samples = []
    counter = 5_000_000  # mJ
    for k in range(30):
        busy = 5 <= k < 20
        power = 400.0 if busy else 100.0
        fields = {"utilization_gpu": 100.0 if busy else 0.0, "power_draw": power}
        if k in (0, 10, 29):  # the counter, read every 10th sample here
            fields["total_energy_consumption"] = counter
        counter += int(power * STEP * 1000 * 1.1)  # the counter says 10 % more than power x time
        samples.append(([gpu(**fields)], [worker(s=snap(7) if busy else IDLE)]))
    run(acc, clock, samples)
    job, idle = totals(acc, 7)["energy_joules"], totals(acc, IDLE_JOB)["energy_joules"]
    first, last = 5_000_000, samples[29][0][0][1]["total_energy_consumption"]
    assert job + idle == pytest.approx((last - first) / 1000, rel=1e-9), "jobs + idle = the counter's delta"
    # the counter intervals (0, 10] and (10, 29]: each split by power x time
    assert job == pytest.approx(
        1.1 * 400 * STEP * 15 * (last - first - 1.1 * 100 * STEP * 1000) / (last - first), rel=0.05
    )


def test_energy_before_the_first_counter_read_is_not_counted_and_a_counter_going_back_rebases():
    acc, clock, said = make()
    samples = [
        ([gpu(power_draw=100.0, total_energy_consumption=1000)], [worker(s=snap(1))]),
        ([gpu(power_draw=100.0)], [worker(s=snap(1))]),
        ([gpu(power_draw=100.0, total_energy_consumption=21000)], [worker(s=snap(1))]),
        ([gpu(power_draw=100.0, total_energy_consumption=500)], [worker(s=snap(1))]),  # the driver reloaded
        ([gpu(power_draw=100.0, total_energy_consumption=20500)], [worker(s=snap(1))]),
    ]
    run(acc, clock, samples)
    assert totals(acc, 1)["energy_joules"] == pytest.approx(20.0 + 20.0)
    assert any("went back" in s for s in said)


def test_without_an_energy_counter_the_energy_is_integrated_power():
    acc, clock, _ = make()
    run(acc, clock, [([gpu(power_draw=250.0, utilization_gpu=10.0)], [worker(s=snap(1))])] * 5)
    assert totals(acc, 1)["energy_joules"] == pytest.approx(250.0 * 5 * STEP)


def test_memory_peak_and_time_average_of_the_jobs_workers_a_worker_of_two_jobs_counts_for_both():
    acc, clock, _ = make()
    samples = [
        (
            [
                gpu(
                    users=[
                        ("a", {"worker_memory_used": m, SHARE: 0.0}),
                        ("b", {"worker_memory_used": 1024.0, SHARE: 0.0}),
                    ]
                )
            ],
            [worker("a", snap(1, 2)), worker("b", snap(2))],
        )
        for m in (512.0, 2048.0, 512.0, 512.0)
    ]
    run(acc, clock, samples)
    one, two = totals(acc, 1), totals(acc, 2)
    assert one["memory_peak_bytes"] == 2048.0 * 2**20 and two["memory_peak_bytes"] == (2048.0 + 1024.0) * 2**20
    mean = one["memory_byte_seconds"] / one["gpu_seconds"]
    assert mean == pytest.approx((512.0 + 2048.0 + 512.0 + 512.0) / 4 * 2**20)


def test_cpu_seconds_split_like_the_workers_share_the_rest_idle():
    acc, clock, _ = make()
    run(acc, clock, [([], [worker("a", snap(1, 2), cpu=100.0), worker("b", IDLE, cpu=10.0)])] * 5)
    live = acc.live()
    assert live["jobs"]["1"]["cpu_seconds"] == pytest.approx(0.5 * 5 * STEP)
    assert live["jobs"]["2"]["cpu_seconds"] == pytest.approx(0.5 * 5 * STEP)
    assert live["idle"]["cpu_seconds"] == pytest.approx(0.1 * 5 * STEP)


def test_gpm_seconds_wait_for_the_gpm_value_of_their_window():
    acc, clock, _ = make()
    samples = [([gpu(utilization_gpu=100.0, sm_active=50.0, pipe_tensor_active=40.0)], [worker(s=snap(1))])]
    samples += [([gpu(utilization_gpu=100.0)], [worker(s=snap(1))])]  # a GPM window of two samples
    samples += [([gpu(utilization_gpu=100.0, sm_active=80.0, pipe_tensor_active=60.0)], [worker(s=snap(1))])]
    run(acc, clock, samples[:2])
    assert totals(acc, 1)["sm_active_seconds"] == pytest.approx(0.5 * STEP), "the second window waits"
    run(acc, clock, samples[2:], start=2)
    assert totals(acc, 1)["sm_active_seconds"] == pytest.approx((0.5 + 0.8 + 0.8) * STEP)
    assert totals(acc, 1)["tensor_active_seconds"] == pytest.approx((0.4 + 0.6 + 0.6) * STEP)


def test_busy_never_exceeds_wall_times_gpus():
    acc, clock, _ = make()
    two = [gpu("GPU-a", utilization_gpu=100.0), gpu("GPU-b", utilization_gpu=100.0)]
    run(acc, clock, [(two, [worker(s=snap(1, 2, 3))])] * 50)
    live = acc.live()
    busy = sum(f.get("busy_seconds", 0.0) for e in [*live["jobs"].values(), live["idle"]] for f in e["gpus"].values())
    assert busy <= 50 * STEP * 2 + 1e-9


def _written(points):
    return {(p.tags["job"], p.tags.get("uuid")): p for p in points}


def test_points_every_interval_carry_the_totals_so_far_and_a_lost_point_costs_nothing():
    acc, clock, _ = make(interval=1.0)
    points = run(acc, clock, [([gpu(utilization_gpu=100.0)], [worker(s=snap(1))])] * 26)
    assert {p.measurement for p in points} == {ACCOUNTING}
    times = sorted({p.time_ns for p in points})
    assert len(times) == 6, "at the first sample, then every second"
    busy = [p.fields["busy_seconds"] for p in points if p.tags["job"] == "1"]
    assert busy == sorted(busy) and busy[-1] == pytest.approx(26 * STEP), "cumulative, monotonic"
    p = points[-1]
    assert set(p.tags) == {"host", "worker", "job", "uuid", "since"} and p.tags["worker"] == "agent-h"


def test_a_job_ending_on_the_host_is_written_at_once_at_most_once_a_second():
    acc, clock, _ = make(interval=100.0)
    run(acc, clock, [([gpu(utilization_gpu=100.0)], [worker(s=snap(1))])])  # the first interval's points
    flips = []
    for k in range(1, 9):
        s = snap(1) if k % 2 else IDLE
        clock.t = k * STEP
        flips.append(acc.update(int(k * STEP * NS), int(k * STEP * NS), [gpu(utilization_gpu=100.0)], [worker(s=s)]))
    ended = [k for k, points in enumerate(flips, 1) if any(p.tags["job"] == "1" for p in points)]
    assert ended == [2, 8], "the job's end on the host, again a second later at most"


def test_a_final_sample_writes_every_row_and_close_gives_them_for_repeating():
    acc, clock, _ = make(interval=100.0)
    run(acc, clock, [([gpu(utilization_gpu=100.0)], [worker(s=snap(1), cpu=50.0)])] * 3)
    final = acc.update(
        int(3 * STEP * NS), int(3 * STEP * NS), [gpu(utilization_gpu=100.0)], [worker(s=snap(1))], final=True
    )
    assert set(_written(final)) == {("1", "GPU-a"), ("1", None), (IDLE_JOB, "GPU-a")}
    assert [p.fields for p in acc.close()] == [p.fields for p in final]
    sent = []
    A.repeat(acc.close(), sent.append)
    assert len(sent) == A.FINAL_REPEATS and all(s == sent[0] for s in sent)


def test_close_settles_windows_still_waiting():
    acc, clock, _ = make()
    samples = [
        ([gpu(users=[("a", {}), ("b", {})], utilization_gpu=100.0)], [worker("a", snap(1)), worker("b", snap(2))])
    ]
    run(acc, clock, samples * 3)
    closing = acc.close(now_ns=int(10 * NS))
    assert totals(acc, IDLE_JOB)["busy_seconds"] == pytest.approx(3 * STEP)
    assert any(p.tags["job"] == IDLE_JOB for p in closing)


def test_a_jobs_rows_leave_after_the_retention_and_come_back_with_a_new_since():
    acc, clock, _ = make(interval=1.0, retention=2.0)
    run(acc, clock, [([gpu(utilization_gpu=100.0)], [worker(s=snap(1))])] * 5)
    first = {p.tags["since"] for p in acc.close() if p.tags["job"] == "1"}
    points = run(acc, clock, [([gpu(utilization_gpu=0.0)], [worker(s=IDLE)])] * 20, start=5)
    assert "1" not in acc.live()["jobs"], "gone 2 s after the job last ran"
    assert any(p.tags["job"] == "1" for p in points), "written at every interval until then"
    run(acc, clock, [([gpu(utilization_gpu=100.0)], [worker(s=snap(1))])] * 2, start=25)
    again = {p.tags["since"] for p in acc.close() if p.tags["job"] == "1"}
    assert again and not again & first and totals(acc, 1)["busy_seconds"] == pytest.approx(2 * STEP)


def test_live_is_plain_json_with_totals_and_each_jobs_figures_now():
    acc, clock, _ = make()
    users = [("a", {"worker_gpu_share": 75.0, "worker_memory_used": 100.0}), ("b", {"worker_gpu_share": 25.0})]
    run(
        acc,
        clock,
        [([gpu(users=users, utilization_gpu=80.0, sm_active=60.0)], [worker("a", snap(1)), worker("b", snap(2))])] * 3,
    )
    live = json.loads(json.dumps(acc.live()))
    assert live["jobs"]["1"]["now"]["GPU-a"] == {
        "utilization_gpu": 60.0,
        "sm_active": 45.0,
        "memory_bytes": 100.0 * 2**20,
    }
    assert live["jobs"]["2"]["now"]["GPU-a"]["utilization_gpu"] == 20.0
    assert live["gpus"]["GPU-a"]["utilization_gpu"] == 80.0 and live["jobs"]["1"]["gpus"]["GPU-a"]["busy_seconds"] > 0


def test_from_settings_follows_the_tracking_list_and_the_port():
    from dask_influx_metrics.config import Settings

    assert A.from_settings(Settings.resolve({"tracking": ["compute-util"]}), {}) is None
    kept = A.from_settings(Settings.resolve({"tracking": ["compute-util"], "prometheus.port": 9847}), {}, serve=True)
    assert kept is not None and not kept.write, "kept for /metrics only: no points"
    acc = A.from_settings(Settings.resolve({"tracking": ["accounting"], "accounting.interval": 2}), {"host": "h"})
    assert acc.write and acc.interval == 2.0 and acc.tags["host"] == "h"


def test_gauges_hold_only_what_the_last_sample_read():
    """A worker that left leaves the per-worker gauges; a GPU no worker uses keeps its totals, not its reading."""
    acc, clock, _ = make()
    both = [("a", {SHARE: 50.0}), ("b", {SHARE: 50.0})]
    run(acc, clock, [([gpu(users=both, utilization_gpu=80.0)], [worker("a", snap(1)), worker("b", snap(2))])] * 3)
    assert set(acc.gauges()["GPU-a"][2]) == {"tcp://a:1", "tcp://b:1"}
    run(acc, clock, [([gpu(users=both[:1], utilization_gpu=80.0)], [worker("a", snap(1))])], start=3)
    assert set(acc.gauges()["GPU-a"][2]) == {"tcp://a:1"}
    run(acc, clock, [([gpu("GPU-b", utilization_gpu=10.0)], [worker("c", snap(3))])], start=4)
    tags, device, workers, totals = acc.gauges()["GPU-a"]
    assert device == {} and workers == {} and totals["busy_seconds"] > 0
