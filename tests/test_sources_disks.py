"""Disk usage of the filesystems the workers write to (issue 47): psutil's figures, each filesystem once, tagged
with its mount point; at the host refresh rate; written by the collector with the host point."""

from __future__ import annotations

import logging
import os
import time

import psutil
import pytest

from dask_influx_metrics.link.snapshot import Snapshot
from dask_influx_metrics.sampling.collect import HostCollector
from dask_influx_metrics.sampling.sources.disks import DiskUsage, mount_point

ALL = frozenset({("disk", "used_percent"), ("disk", "used"), ("disk", "total")})


def test_usage_equals_psutils(tmp_path):
    (reading,) = DiskUsage(ALL).read([str(tmp_path)])
    theirs = psutil.disk_usage(str(tmp_path))
    assert reading.tags == {"path": mount_point(str(tmp_path))}
    assert reading.fields["total"] == theirs.total and reading.fields["used_percent"] == pytest.approx(
        theirs.percent, abs=0.1
    )
    assert abs(reading.fields["used"] - theirs.used) < 64 << 20  # read a moment apart
    assert {type(v) for v in reading.fields.values()} == {int, float}


def test_each_filesystem_once_under_its_mount_point(tmp_path):
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    paths = [str(tmp_path), str(inner), None, "/dev/shm" if os.path.ismount("/dev/shm") else str(tmp_path)]
    readings = DiskUsage(ALL).read(paths)
    assert sorted(r.tags["path"] for r in readings) == sorted({mount_point(p) for p in paths if p})
    assert mount_point(str(inner)) == mount_point(str(tmp_path)) and os.path.ismount(mount_point(str(inner)))


def test_only_the_asked_fields_and_an_unreadable_path_is_said_once(tmp_path, caplog):
    source = DiskUsage(frozenset({("disk", "used_percent")}))
    for _ in range(2):
        (reading,) = source.read([str(tmp_path / "gone"), str(tmp_path)])
        assert list(reading.fields) == ["used_percent"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "gone" in warnings[0]


def test_due_once_refresh_seconds_have_passed_since_a_read(tmp_path):
    source = DiskUsage(ALL, refresh=0.2)
    assert source.due() and source.read([str(tmp_path)]) and not source.due()
    time.sleep(0.25)
    assert source.due()


class Worker:
    def __init__(self, i, local_directory):
        self.id, self.pid, self.local_directory = str(i), os.getpid(), local_directory
        self.tags, self.uuids = {"host": "h", "worker": f"w{i}"}, []
        self.snapshot = lambda: Snapshot(((("k", 0), i, 10 + i),), i, 0, 1)
        self.offset = lambda: 0.0

    def read(self, snap=None):
        return {"tasks": 1}


def test_the_collector_writes_one_point_per_filesystem_with_the_host_points_tags_and_time(tmp_path):
    fields = ALL | {("host", "memory_used_percent"), ("worker", "tasks")}
    from dask_influx_metrics.sampling.sources.host import HostSource

    collector = HostCollector(fields, None, HostSource(fields), DiskUsage(ALL, refresh=60), paths=["/"])
    points = collector.collect([Worker(1, str(tmp_path)), Worker(2, str(tmp_path))], now_ns=7)
    (host,) = [p for p in points if p.measurement == "host"]
    written = [p for p in points if p.measurement == "disk"]
    assert sorted(p.tags["path"] for p in written) == sorted({"/", mount_point(str(tmp_path))})
    for p in written:
        assert p.time_ns == host.time_ns and {k: v for k, v in p.tags.items() if k != "path"} == host.tags
    assert host.tags["job"] == "1,2" and host.tags["dag"] == "11,12"
    again = collector.collect([Worker(1, str(tmp_path))], now_ns=8)  # written when read: once per refresh
    assert [p.measurement for p in again] == ["worker", "host"]
