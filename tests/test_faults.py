"""Issue 43's faults on a real LocalCluster, each scaled down for CI (the full sizes: ``tests/faults.py --full``,
figures in docs/faults.md): the run folder's file system full (a 2 MiB tmpfs in a mount namespace of its own;
skipped with the reason where none can be mounted), the agent SIGKILLed under a backlog with the http sink,
InfluxDB down, a worker SIGKILLed."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import faults
import pytest
from tmpfs import run_in_tmpfs, why_not

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults.py")


def in_tmpfs(*args, mounts) -> dict:
    if why_not():
        pytest.skip(why_not())
    done = run_in_tmpfs([sys.executable, SCRIPT, *args], mounts, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_full_run_folder_kills_nothing_garbles_nothing_and_loses_only_what_no_folder_takes_counted_exactly():
    """One LocalCluster, 400 tasks/s, its run folder a 2 MiB tmpfs: 2 s alone (the monitor never fills it), then
    filled for 2 s (10 s full size), the agent SIGKILLed meanwhile (its successor starts on the full folder): the
    outboxes go to disk, nothing is lost; then the spool's 8 MiB tmpfs (the agent's sink) filled: nothing is
    lost, the task points wait in the outboxes; then both: what is lost is lost while both are full, and
    delivery() and the events count it exactly; after freeing, every task point, no restart."""
    run, spool = tempfile.mkdtemp(prefix="shm"), tempfile.mkdtemp(prefix="spool")  # short: the agent's socket path
    try:
        got = in_tmpfs("shm", "--run", run, "--spool", spool, mounts={run: "2m", spool: "8m"})
    finally:
        os.rmdir(run)
        os.rmdir(spool)
    print(got)
    assert (got["workers_seen"], got["agents_seen"]) == (2, 1 + got["agents_killed_by_us"]), "nobody else died"
    assert got["garbled_lines"] == 0 and got["doubled"] == 0
    assert got["alone"]["samples_full"] == 0 and got["alone"]["max_used"] < got["run_size"] // 2
    assert got["spilled"] > 0 and got["lost_while_run_full"] == 0, "the disk took the outboxes"
    assert got["lost_while_spool_full"] == 0, "the task points waited in the outboxes, not marked sent"
    assert got["lost"] == got["lost_while_both_full"] == got["counted_lost"] == got["reported_lost"], "counted exactly"
    assert got["after_freeing"]["lost"] == 0 < got["after_freeing"]["tasks"]
    assert got["task_points"] == got["tasks"] - got["lost"]
    said = " | ".join(got["moved_events"])
    assert "no room for this worker's outbox" in said and "has room again" in said, "moved, and back: no restart"
    assert any("holds 2048 KiB" in m for m in got["run_folder_said"]), "start() says the run folder is too small"


def test_an_agent_killed_three_times_under_a_backlog_loses_and_doubles_no_task_point_over_http(
    client, influxd, fresh_db
):
    got = faults.agent_kill(client, influxd, fresh_db, tasks=2000, kills=3, batch=250)
    print(got)
    assert got["kills"] == 3 and got["in_influxdb"] == got["points_in_influxdb"] == got["tasks"]
    # at least once: a kill after InfluxDB took a post but before the file's removal posts it again (InfluxDB
    # keeps one copy of a point); at most the file in flight at each kill
    assert got["posted_twice_or_more"] <= 3 * 250
    assert got["left_undelivered"] == 0 and "http-replay" in got["replay_events"], "a successor sent what was left"


def test_an_influxdb_outage_heals_by_itself_in_order_and_once(client, influxd, fresh_db):
    got = faults.influx_down(client, influxd, fresh_db, tasks=1000, down=5.0, rate=100.0)
    print(got)
    assert got["undelivered_lines_while_down"] > 0, "the outage was one"
    assert got["in_influxdb"] == got["tasks"] and got["all_in_s_after_return"] <= 60
    assert got["posted_twice_or_more"] == 0 and got["left_undelivered"] == 0
    assert got["replay_events"] == ["http-replay", "http-replayed"], "said when it starts and ends"


def test_a_killed_worker_loses_at_most_the_task_points_of_its_last_250_ms(client):
    """Last here: the nanny restarts the worker."""
    got = faults.worker_kill(client, polling=2000, seconds=3.0, rate=300.0)
    print(got)
    assert got["victim_tasks_ended"] > 300 and got["garbled_lines"] == 0
    assert got["lost"] <= got["ended_in_its_last_250_ms"] and got["oldest_lost_ended_s_before_kill"] <= 0.25
