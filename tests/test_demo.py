import os
import re

from dask_influx_metrics import demo


def _check_report(out, folder):
    assert "Peak GPU memory per worker and job" in out and "GPU 1 peak MiB" in out
    assert "unused_device_hours" in out
    assert sorted(os.listdir(folder / "csv")) == ["worker_0.csv", "workers.csv"]
    for png in ("lines.png", "boxes.png"):
        data = (folder / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    report = (folder / "gpu-report.html").read_text()
    assert f"report: {folder / 'gpu-report.html'}" in out and all(f'id="job-{j}"' in report for j in (1, 2, 3))


def test_demo_through_udp_into_influxd(influxd, capsys, tmp_path):
    rc = demo.main(
        [
            "--influxdb-url",
            influxd.url,
            "--telegraf-address",
            "%s:%d" % influxd.udp_address,
            "--workers",
            "1",
            "--gpus",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "3 jobs" in out and "UDP ->" in out and "reading back with InfluxQL" in out
    # the DAG table: two DAGs per job, each labelled with its job's label (dag, job, ..., label)
    assert set(re.findall(r"^ *\d+ +(\d+) .* (matmul \+ \d+ busy tasks)$", out, re.M)) == {
        ("1", "matmul + 8 busy tasks"),
        ("2", "matmul + 16 busy tasks"),
        ("3", "matmul + 24 busy tasks"),
    }
    _check_report(out, tmp_path)


def test_demo_spools_when_influxdb_is_unreachable(tmp_path, capsys):
    rc = demo.main(
        [
            "--influxdb-url",
            "http://127.0.0.1:9",
            "--spool",
            str(tmp_path / "spool"),
            "--workers",
            "1",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "spooling to disk" in out and "reading back from the spool" in out
    assert list((tmp_path / "spool").rglob("*.lp"))
    _check_report(out, tmp_path / "out")
