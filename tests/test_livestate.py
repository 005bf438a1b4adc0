"""The dashboard page's state on the scheduler (scheduler/livestate.py), and what the page says when empty."""

from __future__ import annotations

import pytest

from dask_influx_metrics.sampling.live import UNKNOWN
from dask_influx_metrics.scheduler.dashboard import color, status
from dask_influx_metrics.scheduler.jobs import JobBook
from dask_influx_metrics.scheduler.livestate import STALE_S, WINDOW_S, LiveState, formatted


def entry(jobs, gpus, host="node1", pid=7, samples=10, age=0.1, sinks=(("spool", 100, 0, 0),), **extra):
    return {
        "jobs": jobs,
        "prefixes": ["mm"],
        "gpus": gpus,
        "agent": [host, pid, samples, age],
        "sinks": list(sinks),
    } | extra


def gpu(uuid, util=None, mem=None, total=1000, sm=None, share=None, own=None):
    """A GPU row; ``uuid`` only names it here (rows are known by their position in the worker's list)."""
    return [util, mem, total, sm, share, own]


def test_each_heartbeat_is_taken_once():
    state = LiveState()
    e = entry([[1, 1]], [gpu("GPU-a", 50)])
    assert state.update([("tcp://w:1", 10.0, e), ("tcp://w:2", 10.0, None)], now=10.0) == 1
    assert state.update([("tcp://w:1", 10.0, e)], now=10.5) == 0  # the same heartbeat
    assert state.update([("tcp://w:1", 11.0, e)], now=11.0) == 1
    assert state.taken == 2
    assert [t for t, *_ in state.strips["tcp://w:1", 0]] == [10.0, 11.0]


def test_an_entry_of_another_shape_is_left_out():
    state = LiveState()
    good = entry([[1, 1]], [gpu("GPU-a", 50)])
    beats = [("tcp://w:1", 10.0, {"jobs": "?"}), ("tcp://w:2", 10.0, {"gpus": [[1, 2]]}), ("tcp://w:3", 10.0, good)]
    assert state.update(beats, now=10.0) == 1 and state.refused == 2
    assert list(state.workers) == ["tcp://w:3"]


def test_strips_keep_five_minutes_and_forget_workers_gone():
    state = LiveState()
    for t in range(0, 400, 2):
        state.update([("tcp://w:1", float(t), entry([[1, 1]], [gpu("GPU-a", t % 100)]))], now=float(t))
    strip = state.strips["tcp://w:1", 0]
    assert strip[0][0] >= 398 - WINDOW_S and strip[-1][0] == 398
    state.update([("tcp://w:2", 800.0, entry([], [gpu("GPU-b", 0)]))], now=800.0)
    assert set(state.strips) == {("tcp://w:2", 0)} and set(state.workers) == {"tcp://w:2"}


def test_a_job_gets_its_own_share_of_a_shared_gpu_and_the_jobs_add_up_to_the_device():
    state = LiveState()
    busy = entry([[1, 2]], [gpu("GPU-s", 90, 20000, 80000, sm=80, share=97, own=15000)])
    holder = entry([[2, 1]], [gpu("GPU-s", 90, 20000, 80000, sm=80, share=3, own=5000)])
    state.update([("tcp://w:1", 100.0, busy), ("tcp://w:2", 100.0, holder)], now=100.0)
    rows = {r["job"]: r for r in state.jobs(now=100.5)}
    assert rows[1]["util"] == pytest.approx(87.3) and rows[2]["util"] == pytest.approx(2.7)
    assert rows[1]["sm"] + rows[2]["sm"] == pytest.approx(80.0)  # conserved: the device's SM active
    assert (rows[1]["mem"], rows[2]["mem"]) == (15000.0, 5000.0)  # each job's workers' own processes


def test_the_jobs_of_one_worker_split_it_by_their_tasks():
    state = LiveState()
    e = entry([[1, 3], [2, 1]], [gpu("GPU-a", 100, own=400), gpu("GPU-b", 60, own=200)])
    state.update([("tcp://w:1", 100.0, e)], now=100.0)
    rows = {r["job"]: r for r in state.jobs(now=100.0)}
    assert rows[1]["util"] == pytest.approx(120.0) and rows[2]["util"] == pytest.approx(40.0)  # 160 % in all
    assert rows[1]["mem"] == rows[2]["mem"] == 600.0  # the worker's processes hold it for each of its jobs
    assert rows[1]["gpus"] == rows[2]["gpus"] == 2


def test_a_figure_that_cannot_be_known_is_left_out_never_guessed():
    state = LiveState()
    unknown_share = entry([[1, 1]], [gpu("GPU-s", 90, sm=80, share=UNKNOWN, own=10)])
    no_gpm = entry([[2, 1]], [gpu("GPU-a", 50, sm=None, own=None)])
    state.update([("tcp://w:1", 100.0, unknown_share), ("tcp://w:2", 100.0, no_gpm)], now=100.0)
    rows = {r["job"]: r for r in state.jobs(now=100.0)}
    assert (rows[1]["util"], rows[1]["sm"], rows[1]["mem"]) == (None, None, 10.0)
    assert (rows[2]["util"], rows[2]["sm"], rows[2]["mem"]) == (50.0, None, None)
    assert formatted(rows[2]) | {"label": ""} == {
        "job": "2",
        "label": "",
        "util": "50 %",
        "sm": "-",
        "mem": "-",
        "gpus": "1",
        "busy": "-",
        "energy": "-",
        "dags": "-",
    }


def test_jobs_of_the_book_with_labels_and_running_dags_and_stale_entries_are_not_now():
    book = JobBook("client")
    book.submit("Client-a", ["x"], now=1.0)
    book.submit("Client-b", ["y"], now=2.0)
    book.task_done("x")
    state = LiveState()
    state.update([("tcp://w:1", 100.0, entry([[2, 1]], [gpu("GPU-a", 70)]))], now=100.0)
    rows = state.jobs(now=100.0, book=book)
    assert [(r["job"], r["label"], r["util"], r["dags"]) for r in rows] == [
        (1, "Client-a", 0.0, []),
        (2, "Client-b", 70.0, [2]),
    ]
    assert [r["util"] for r in state.jobs(now=100.0 + STALE_S + 1, book=book)] == [0.0, 0.0]


def test_accounting_counters_add_up_over_the_samplers_and_give_their_now_figures():
    state = LiveState()
    # [job, busy GPU-s in hundredths, energy J, util, sm, mem MiB, GPUs]: the samplers' own rule, not the entries'
    one = entry(
        [[1, 1]], [gpu("GPU-a", 90)], host="n1", acct=[[1, 3000, 9000, 80, None, 2048, 1], [2, 500, 1000, 0, 0, 0, 0]]
    )
    two = entry([[1, 1]], [gpu("GPU-b", 50)], host="n2", acct=[[1, 1000, 3000, 45, 40, 1024, 1]])
    three = entry([[3, 1]], [gpu("GPU-c", 70, own=512)], host="n3")  # keeps no accounting: from its entry
    state.update([("tcp://a:1", 100.0, one), ("tcp://b:1", 100.0, two), ("tcp://c:1", 100.0, three)], now=100.0)
    rows = {r["job"]: r for r in state.jobs(now=100.0)}
    assert (rows[1]["busy_s"], rows[1]["energy_j"], rows[2]["busy_s"]) == (40.0, 12000.0, 5.0)
    assert (rows[1]["util"], rows[1]["sm"], rows[1]["mem"], rows[1]["gpus"]) == (125.0, None, 3072.0, 2)
    assert (rows[3]["util"], rows[3]["mem"], rows[3]["busy_s"]) == (70.0, 512.0, None)
    assert formatted(rows[1])["busy"] == "40.0 s" and formatted(rows[1])["energy"] == "12.00 kJ"
    later = {r["job"]: r for r in state.jobs(now=100.0 + STALE_S + 1)}  # no fresh figure: totals stay
    assert (later[1]["busy_s"], later[1]["util"], later[1]["gpus"]) == (40.0, 0.0, 0)


def test_a_total_one_sampler_cannot_give_yet_is_not_known_never_a_part():
    """Energy comes with each GPU's counter read (every 10 s): until then a host's total for the job is None,
    and so is the sum over the hosts (the page shows "-", never the other hosts' part as the job's)."""
    state = LiveState()
    one = entry([[1, 1]], [gpu("GPU-a", 90)], host="n1", acct=[[1, 3000, 9000, 80, None, 2048, 1]])
    two = entry([[1, 1]], [gpu("GPU-b", 50)], host="n2", acct=[[1, 1000, None, 45, 40, 1024, 1]])
    state.update([("tcp://a:1", 100.0, one), ("tcp://b:1", 100.0, two)], now=100.0)
    [row] = state.jobs(now=100.0)
    assert (row["busy_s"], row["energy_j"], formatted(row)["energy"]) == (40.0, None, "-")
    read = entry([[1, 1]], [gpu("GPU-b", 50)], host="n2", acct=[[1, 1100, 2500, 45, 40, 1024, 1]])
    state.update([("tcp://b:1", 101.0, read)], now=101.0)  # its counter read: the sum is known again
    [row] = state.jobs(now=101.0)
    assert (row["busy_s"], row["energy_j"]) == (41.0, 11500.0)


def test_health_per_sampling_process():
    state = LiveState()
    state.update([("tcp://w:1", 100.0, entry([], [], host="n1", pid=7, samples=50, age=0.3))], now=100.0)
    state.update([("tcp://w:2", 101.0, entry([], [], host="n1", pid=7, samples=55, age=0.1))], now=101.0)
    [row] = state.health(now=102.0)
    assert (row["host"], row["pid"], row["samples"], row["age"]) == ("n1", 7, 55, pytest.approx(1.1))


class Plugin:
    def __init__(self, session=None, last=None, destinations=None):
        self.session, self.last_session, self.destinations = session, last, destinations or {}


def test_the_page_says_plainly_why_it_shows_nothing():
    assert "No monitor is attached" in status(None, None, 0.0)
    assert "No monitoring session has run yet" in status(Plugin(), LiveState(), 0.0)
    running = Plugin({"id": "s1"}, destinations={"tcp://w:1": {"gpu": {"gpu": "simulated", "why": ""}}})
    assert "Nothing sampled yet" in status(running, LiveState(), 0.0)
    no_gpu = Plugin({"id": "s1"}, destinations={"tcp://w:1": {"gpu": {"gpu": "no-driver", "why": "no GPU"}}})
    assert "the workers found no GPU</b>: no-driver (no GPU)" in status(no_gpu, LiveState(), 0.0)
    state = LiveState()
    state.update([("tcp://w:1", 10.0, entry([[1, 1]], [gpu("GPU-a", 5)]))], now=10.0)
    assert "1 worker(s) reporting now, 1 GPU(s)" in status(running, state, 10.0)


def test_job_colours():
    assert color("") != color("1") != color("2") != color("1,2") == color("3,4")
