from dask_influx_metrics import demo


def test_demo_through_udp_into_influxd(influxd, capsys):
    rc = demo.main(["--influxdb-url", influxd.url, "--telegraf-address", "%s:%d" % influxd.udp_address,
                    "--workers", "1", "--gpus", "2"])
    out = capsys.readouterr().out
    assert rc == 0 and "3 jobs" in out and "UDP ->" in out
    assert "mean util %" in out


def test_demo_spools_when_influxdb_is_unreachable(tmp_path, capsys):
    rc = demo.main(["--influxdb-url", "http://127.0.0.1:9", "--spool", str(tmp_path), "--workers", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "spooling to disk" in out
    assert list(tmp_path.rglob("*.lp"))
