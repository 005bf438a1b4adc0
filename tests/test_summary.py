"""Utilization summaries: a job's rows cover its own busy samples; "held but idle" device-hours (issue 10)."""

import numpy as np
import pandas as pd
import pytest
import shared_gpu as S
import short_tasks

from dask_influx_metrics import query
from dask_influx_metrics.client import summary

HOUR_PER_SAMPLE = S.STEP / 1e9 / 3600


@pytest.fixture(scope="module")
def stores(influxd, tmp_path_factory):
    with S.stores(influxd, tmp_path_factory.mktemp("shared-gpu"), "shared_gpu_summary") as both:
        yield both


def _gpu(frame, worker, job):
    rows = frame[
        (frame["worker_index"] == worker)
        & (frame["resource"] == "gpu")
        & (frame["job"].isna() if job is None else frame["job"] == job)
    ]
    assert len(rows) == 1
    return rows.iloc[0]


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_job_rows_hold_the_jobs_busy_samples_only(stores, kind):
    s = query.summary(stores[kind])
    util = [u for u, *_ in S.SAMPLES]
    job1 = _gpu(s, 0, 1)  # job 1 is never charged job 2's 100 % samples
    assert (job1["samples"], job1["mean"], job1["max"]) == (6, pytest.approx(np.mean(util[:6])), 70)
    assert job1["held_idle_device_hours"] == 0
    job3 = _gpu(s, 0, 3)  # a sleep holding 4.5 GiB: all of it held but idle
    assert (job3["samples"], job3["mean"]) == (4, 0)
    assert job3["held_idle_device_hours"] == pytest.approx(4 * HOUR_PER_SAMPLE)
    job2 = _gpu(s, 1, 2)
    assert (job2["samples"], job2["mean"], job2["held_idle_device_hours"]) == (8, 100, 0)
    jobs = s.dropna(subset=["job", "worker_index"])
    assert set(zip(jobs["worker_index"], jobs["job"])) == {(0, 1), (0, 3), (1, 2)}
    # the whole session counts every sample, idle ones too: worker 1 held 16.5 GiB while idle in phase C
    whole = _gpu(s, 1, None)
    assert whole["samples"] == len(S.SAMPLES) and whole["mean"] == pytest.approx(np.mean(util))
    assert whole["held_idle_device_hours"] == pytest.approx(4 * HOUR_PER_SAMPLE)


@pytest.mark.parametrize("kind", ["influxql", "spool"])
def test_all_workers_rows_count_the_shared_gpu_once(stores, kind):
    """Issue 33: each worker's rows hold the GPU they share (their own view: 9 s of device time each); the
    ``all workers`` rows count it once: device-hours are the session's wall time x 1 GPU, and held-but-idle
    time is the phase in which the GPU computed nothing while either worker held memory on it."""
    s = query.summary(stores[kind])
    gpu = s[s["resource"] == "gpu"]
    mine = gpu[gpu["worker_index"].notna() & gpu["job"].isna()]
    assert mine["device_hours"].tolist() == pytest.approx([18 * HOUR_PER_SAMPLE] * 2)
    every = gpu[gpu["worker"] == summary.ALL].set_index("job", drop=False)
    assert every["worker_index"].isna().all() and (every["devices"] == 1).all()
    whole = every[every["job"].isna()].iloc[0]
    assert whole["device_hours"] == pytest.approx(18 * HOUR_PER_SAMPLE) == whole["hours"]
    assert whole["held_idle_device_hours"] == pytest.approx(4 * HOUR_PER_SAMPLE)
    assert whole["mean"] == pytest.approx(np.mean([u for u, *_ in S.SAMPLES]))
    hours = {int(j): r["device_hours"] / HOUR_PER_SAMPLE for j, r in every.dropna(subset=["job"]).iterrows()}
    assert hours == pytest.approx({1: 6, 2: 8, 3: 4})  # each job's own samples, on one GPU


def test_spool_and_influx_summaries_are_equal(stores):
    pd.testing.assert_frame_equal(query.summary(stores["influxql"]), query.summary(stores["spool"]), check_dtype=False)


def _table(**columns):
    n = len(next(iter(columns.values())))
    t = pd.DataFrame({"job": ["1"] * n, "dag": ["1"] * n, "timestamp": np.arange(n) * 0.5, **columns})
    t.attrs = {"worker": "tcp://a:1", "worker_index": 0}
    return t


def test_held_but_idle_uses_the_workers_own_memory_then_the_devices():
    t = _table(
        **{
            "compute-util[0]": [0.0, 0.0, 0.0, 50.0, 0.0],
            "worker-gpu-mem[0]": [0.0, 2e9, np.nan, 2e9, np.nan],  # missing in two samples
            "total-mem[0]": [3e9, 3e9, 3e9, 3e9, 0.0],
            "compute-util[1]": [0.0] * 5,
            "total-mem[1]": [1e9] * 5,
        }
    )  # GPU 1: device memory only
    held = summary.held_memory(t, ["compute-util[0]", "compute-util[1]"])
    assert held[:, 0].tolist() == [0, 1, 1, 1, 0] and held[:, 1].tolist() == [1] * 5
    (whole,) = summary.summarize([t], per_job=False).itertuples()
    # GPU 0: samples 1 and 2 (held, util 0); GPU 1: all 5
    assert whole.held_idle_device_hours == pytest.approx(7 * HOUR_PER_SAMPLE)
    assert whole.held_idle_device_hours <= whole.device_hours


def test_held_but_idle_is_nan_without_memory_metrics():
    s = summary.summarize([_table(**{"compute-util[0]": [0.0, 0.0], "host-cpu": [1.0, 2.0]})])
    assert s["held_idle_device_hours"].isna().all()
    assert summary.held_memory(_table(**{"compute-util[0]": [0.0]}), ["compute-util[0]"]) is None


def _short_task_table():
    """The short-task workload (tests/short_tasks.py) on GPU 0; GPU 1 reads 40 % throughout."""
    times, util = short_tasks.samples()
    return _table(
        **{
            "compute-util[0]": util,
            "compute-util[1]": np.full(len(times), 40.0),
            "total-mem[0]": np.full(len(times), 1e9),
        }
    ).assign(timestamp=times)


def test_means_and_hours_are_time_weighted_on_irregular_samples():
    # issue 23 item 6: wake samples at task starts put most busy samples where tasks start
    t = _short_task_table()
    busy = short_tasks.TRUTH
    (whole,) = summary.summarize([t], per_job=False).itertuples()
    per_sample = t["compute-util[0]"].mean()  # what a per-sample mean read: 30 % against 0.95 %
    assert per_sample > 30
    assert whole.mean == pytest.approx((busy + 40) / 2)
    assert whole.hours == pytest.approx(20 / 3600) and whole.device_hours == pytest.approx(2 * 20 / 3600)
    assert whole.unused_device_hours == pytest.approx(20 / 3600 * ((1 - busy / 100) + 0.6))
    assert whole.above_80 == pytest.approx(busy / 100 / 2)  # a share of the time, not of the samples
    assert whole.held_idle_device_hours == pytest.approx(20 * (1 - busy / 100) / 3600)  # GPU 0 held, idle
    assert whole.samples == len(t)


def test_a_gap_counts_a_few_intervals_at_most():
    t = _table(**{"compute-util[0]": [100.0] + [0.0] * 40})
    t["timestamp"] = np.append(0.0, 600 + np.arange(40) * 0.5)  # ten minutes without a sample after the first
    (whole,) = summary.summarize([t], per_job=False).itertuples()
    assert whole.hours == pytest.approx((summary.CAP_INTERVALS * 0.5 + 40 * 0.5) / 3600)
    assert whole.mean == pytest.approx(100 * 0.5 / 21.5)  # the first reading stands for one interval


# --- node rows (issue 47): tests/node_points.py, two nodes, hand-computed answers -------------------
@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    import node_points as NP

    with query.connect(NP.write_spool(tmp_path_factory.mktemp("nodes"))) as db:
        yield db


def _node(frame, worker, resource, job):
    rows = frame[
        (frame["worker_index"] == worker)
        & (frame["resource"] == resource)
        & (frame["job"].isna() if job is None else frame["job"] == job)
    ]
    assert len(rows) == 1
    return rows.iloc[0]


def test_node_rows_per_job_are_the_hosts_figures_in_the_jobs_windows(nodes):
    import node_points as NP

    s, mib, hour = query.summary(nodes), NP.MIB, NP.STEP / 1e9 / 3600
    cpu = _node(s, 0, "cpu", 1)  # node-a while job 1 ran: 10 samples, one core of two busy
    assert (cpu["samples"], cpu["mean"], cpu["core_max"], cpu["core_min"], cpu["devices"]) == (10, 50, 100, 0, 2)
    assert cpu["device_hours"] == pytest.approx(2 * 10 * hour) and cpu["host"] == "node-a"
    assert _node(s, 0, "cpu", None)["mean"] == pytest.approx((20 * 50 + 10 * 5) / 30)
    assert _node(s, 0, "memory", 1)[["mean", "max"]].tolist() == [40, 40]
    disk = _node(s, 0, "disk", 1)  # the fullest of node-a's filesystems; 1 MiB read, 2 written per window
    assert (disk["max"], disk["read_bytes"], disk["write_bytes"]) == (70, 10 * mib, 20 * mib)
    net = _node(s, 0, "network", 2)
    assert net[["lo_sent_bytes", "lo_recv_bytes", "ext_sent_bytes", "ext_recv_bytes"]].tolist() == [
        45 * mib,
        45 * mib,
        15 * mib,
        15 * mib,
    ]
    assert _node(s, 0, "disk", None)["read_bytes"] == 29 * mib  # every window after the first
    # every worker of a host: its host's rows
    pd.testing.assert_frame_equal(
        s[s["worker_index"] == 0]
        .drop(columns=["worker_index", "worker"])
        .query("resource != 'gpu'")
        .reset_index(drop=True),
        s[s["worker_index"] == 1]
        .drop(columns=["worker_index", "worker"])
        .query("resource != 'gpu'")
        .reset_index(drop=True),
    )


def test_a_counter_that_went_back_leaves_its_window_out_and_says_so(nodes):
    import node_points as NP

    s = query.summary(nodes)
    b = _node(s, 2, "disk", 2)  # node-b, job 2: 15 windows, the one at its reboot left out
    assert (b["read_bytes"], b["max"], b["host"]) == (14 * NP.MIB, 30, "node-b")
    assert _node(s, 2, "network", None)["ext_sent_bytes"] == 28 * NP.MIB
    notes = [n for n in nodes.notes if "went back" in n]
    assert [n.split(":")[0] for n in notes] == ["host node-b"] * 2  # one for the disk totals, one for the network's
    assert "host.disk_read_bytes 1x, host.disk_write_bytes 1x" in notes[0] and "network totals" in notes[1]


def test_node_rows_without_cores_leave_core_hours_out():
    t = _table(**{"host-cpu": [50.0, 50.0, 50.0], summary.CORE_MAX: [100.0] * 3})
    cpu = summary.summarize([t], per_job=False, hosts={"tcp://a:1": t}).query("resource == 'cpu'").iloc[0]
    assert cpu["core_max"] == 100 and pd.isna(cpu["devices"]) and np.isnan(cpu["device_hours"])
    assert np.isnan(cpu["core_min"])
