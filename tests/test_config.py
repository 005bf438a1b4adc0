import dask.config
import pytest

from dask_influx_metrics.config import Settings, overrides_from_kwargs, parse_address


def test_defaults_come_from_the_shipped_yaml():
    s = Settings.resolve()
    assert s.polling_interval == 200 and s.database == "dask_metrics"
    assert s.telegraf_address == ("127.0.0.1", 8094) and s.sinks == ("spool",)


def test_environment_style_config_and_per_call_overrides():
    with dask.config.set({"influx-metrics.gpu.source": "simulated", "influx-metrics.gpu.count": 4}):
        s = Settings.resolve({"telegraf.address": "10.1.2.3:9000"})
    assert (s.gpu_source, s.gpu_count, s.telegraf_address) == ("simulated", 4, ("10.1.2.3", 9000))


def test_env_variables_reach_settings(monkeypatch):
    monkeypatch.setenv("DASK_INFLUX_METRICS__SINK", "udp")
    monkeypatch.setenv("DASK_INFLUX_METRICS__GPU__COUNT", "3")
    dask.config.refresh()
    try:
        s = Settings.resolve()
        assert s.sinks == ("udp",) and s.gpu_count == 3
    finally:
        monkeypatch.delenv("DASK_INFLUX_METRICS__SINK")
        monkeypatch.delenv("DASK_INFLUX_METRICS__GPU__COUNT")
        dask.config.refresh()


@pytest.mark.parametrize("overrides, message", [
    ({"polling-interval": 0}, "polling-interval"),
    ({"polling-interval": -5}, "polling-interval"),
    ({"tracking": ["compute-util", "gpu-magic"]}, "gpu-magic"),
    ({"telegraf.address": "nohostport"}, "telegraf.address"),
    ({"telegraf.address": "host:99999"}, "telegraf.address"),
    ({"sink": "kafka"}, "sink"),
    ({"gpu.source": "cuda"}, "gpu.source"),
    ({"job-type": "auto"}, "job-type"),
    ({"gpu.count": 0}, "gpu.count"),
    ({"tags": {"worker": "x"}}, "tags"),
])
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        Settings.resolve(overrides)


def test_parse_address_forms():
    assert parse_address("udp://telegraf:8094") == ("telegraf", 8094)
    assert parse_address("[::1]:8094") == ("::1", 8094)


def test_old_mem_limit_and_dump_loc_switch_the_spool_on():
    with dask.config.set({"influx-metrics.sink": "udp"}):
        out = overrides_from_kwargs(mem_limit=10, dump_loc="/tmp/x")
    assert out == {"spool.mem-limit": 10, "spool.directory": "/tmp/x", "sink": ["udp", "spool"]}


def test_unknown_keyword_is_named():
    with pytest.raises(TypeError, match="polling_intervall"):
        overrides_from_kwargs(polling_intervall=5)


def test_hyphenated_keys_set_from_environment_variables(monkeypatch):
    monkeypatch.setenv("DASK_INFLUX_METRICS__POLLING_INTERVAL", "50")
    monkeypatch.setenv("DASK_INFLUX_METRICS__SPOOL__MEM_LIMIT", "7")
    monkeypatch.setenv("DASK_INFLUX_METRICS__JOB_TYPE", "manual")
    dask.config.refresh()
    try:
        s = Settings.resolve()
        assert (s.polling_interval, s.mem_limit, s.job_type) == (50, 7, "manual")
    finally:
        for var in ("POLLING_INTERVAL", "SPOOL__MEM_LIMIT", "JOB_TYPE"):
            monkeypatch.delenv(f"DASK_INFLUX_METRICS__{var}")
        dask.config.refresh()
