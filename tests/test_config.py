import dataclasses
import json
import os
import re

import dask.config
import pytest
import yaml

from dask_influx_metrics import config, configdocs
from dask_influx_metrics.config import Settings, overrides_from_kwargs
from dask_influx_metrics.settingparsers import parse_address


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


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"polling-interval": 0}, "polling-interval"),
        ({"polling-interval": -5}, "polling-interval"),
        ({"tracking": ["compute-util", "gpu-magic"]}, "gpu-magic"),
        ({"telegraf.address": "nohostport"}, "telegraf.address"),
        ({"telegraf.address": "host:99999"}, "telegraf.address"),
        ({"sink": "kafka"}, "sink"),
        ({"gpu.source": "cuda"}, "gpu.source"),
        ({"job-type": "auto"}, "job-type"),
        ({"gpu.count": 0}, "gpu.count"),
        ({"sampler.host-refresh": 0}, "sampler.host-refresh"),
        ({"tags": {"worker": "x"}}, "tags"),
    ],
)
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        Settings.resolve(overrides)


@pytest.mark.parametrize(
    "overrides, mode",
    [
        ({}, "agent"),
        ({"sampler.mode": "thread"}, "thread"),
        ({"sampler.mode": "agent"}, "agent"),
        (overrides_from_kwargs(sampler_mode="thread"), "thread"),
    ],
)
def test_sampler_mode_is_agent_or_thread(overrides, mode):
    assert Settings.resolve(overrides).sampler_mode == mode


def test_sampler_mode_from_an_environment_variable(monkeypatch):
    monkeypatch.setenv("DASK_INFLUX_METRICS__SAMPLER__MODE", "thread")
    dask.config.refresh()
    try:
        assert Settings.resolve().sampler_mode == "thread"
    finally:
        monkeypatch.delenv("DASK_INFLUX_METRICS__SAMPLER__MODE")
        dask.config.refresh()


def test_unknown_sampler_mode_names_the_key_and_the_choices():
    with pytest.raises(
        ValueError, match=re.escape("influx-metrics.sampler.mode must be one of ('agent', 'thread'), got 'sidecar'")
    ):
        Settings.resolve({"sampler.mode": "sidecar"})


REMOVED = "influx-metrics.{} was removed; use influx-metrics.sampler.mode"


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"sampler.isolate": False}, "sampler.isolate"),
        ({"sampler.isolate": True}, "sampler.isolate"),
        ({"sampler.host-once": True}, "sampler.host-once"),
        ({"sampler.host_once": False}, "sampler.host-once"),
    ],
)
def test_removed_sampler_settings_as_overrides_name_sampler_mode(overrides, key):
    with pytest.raises(ValueError, match=re.escape(REMOVED.format(key))):
        Settings.resolve(overrides)


def test_removed_sampler_settings_in_dask_config_name_sampler_mode():
    with dask.config.set({"influx-metrics.sampler.isolate": False}):  # e.g. from an old YAML file
        with pytest.raises(ValueError, match=re.escape(REMOVED.format("sampler.isolate"))):
            Settings.resolve()


@pytest.mark.parametrize(
    "var, key",
    [
        ("DASK_INFLUX_METRICS__SAMPLER__ISOLATE", "sampler.isolate"),
        ("DASK_INFLUX_METRICS__SAMPLER__HOST_ONCE", "sampler.host-once"),
    ],
)
def test_removed_sampler_settings_as_environment_variables_name_sampler_mode(monkeypatch, var, key):
    monkeypatch.setenv(var, "false")
    dask.config.refresh()
    try:
        with pytest.raises(ValueError, match=re.escape(REMOVED.format(key))):
            Settings.resolve()
    finally:
        monkeypatch.delenv(var)
        dask.config.refresh()


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


# --- one declaration per setting: the YAML file, docs/settings.md and the keywords come from config.SETTINGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGENERATE = (
    'regenerate: python -c "from dask_influx_metrics import configdocs; '
    'print(configdocs.defaults_yaml(), end=\'\')" > dask_influx_metrics/influx-metrics.yaml'
)


def test_shipped_yaml_is_generated_from_the_table():
    with open(os.path.join(ROOT, "dask_influx_metrics", "influx-metrics.yaml")) as f:
        text = f.read()
    assert text == configdocs.defaults_yaml(), REGENERATE
    assert yaml.safe_load(text) == config.DEFAULTS


def test_docs_settings_table_is_generated_from_the_table():
    with open(os.path.join(ROOT, "docs", "settings.md")) as f:
        section = f.read()
    assert configdocs.settings_table_markdown() in section, (
        "paste configdocs.settings_table_markdown() into docs/settings.md"
    )


def test_every_setting_is_an_attribute_a_keyword_and_a_default():
    s = Settings.resolve()
    for setting in config.SETTINGS:
        assert hasattr(s, setting.attr)
        assert all(config.KWARGS[k] == setting.key for k in setting.kwargs)
        assert dask.config.get(f"influx-metrics.{setting.key}") == setting.default
    old_keywords = {
        "polling_interval",
        "tracking",
        "job_type",
        "sink",
        "tags",
        "telegraf_address",
        "max_datagram",
        "influxdb_url",
        "database",
        "retention_policy",
        "username",
        "password",
        "token",
        "spool_directory",
        "dump_loc",
        "mem_limit",
        "flush_interval",
        "gpu_source",
        "gpu_count",
    }
    assert old_keywords <= set(config.KWARGS)
    assert {"batch_size", "http_timeout", "sampler_mode"} <= set(config.KWARGS)  # new: every setting has a keyword


def test_secrets_stay_out_of_repr():
    s = Settings.resolve({"influxdb.password": "hunter2", "influxdb.token": "t0ken"})
    assert (s.password, s.token) == ("hunter2", "t0ken") and "hunter2" not in repr(s) and "t0ken" not in repr(s)


def test_from_dict_rebuilds_what_travelled_as_json():
    s = Settings.resolve({"sink": ["udp", "spool"], "tags": {"cluster": "a"}, "spool.flush-interval": 0.5})
    assert Settings.from_dict(json.loads(json.dumps(dataclasses.asdict(s)))) == s


def test_numbers_from_text_and_types():
    s = Settings.resolve({"influxdb.timeout": "2.5", "gpu.count": "3", "spool.flush-interval": 2})
    assert (s.http_timeout, s.gpu_count, s.flush_interval) == (2.5, 3, 2.0)
    assert isinstance(s.flush_interval, float) and isinstance(s.gpu_count, int)


# Values the code accepted before but could not honour; each error names the key and the value.
SECONDS = "must be a positive, finite number of seconds, got"
URL = "influx-metrics.influxdb.url must be an http:// or https:// URL"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"polling-interval": 0.5}, "influx-metrics.polling-interval must be a number of ms from 1 to 60000, got 0.5"),
        (
            {"polling-interval": float("inf")},
            "influx-metrics.polling-interval must be a number of ms from 1 to 60000, got inf",
        ),
        ({"spool.flush-interval": float("nan")}, f"influx-metrics.spool.flush-interval {SECONDS} nan"),
        ({"spool.flush-interval": float("inf")}, f"influx-metrics.spool.flush-interval {SECONDS} inf"),
        ({"spool.flush-interval": 0}, f"influx-metrics.spool.flush-interval {SECONDS} 0"),
        ({"spool.flush-interval": -1}, f"influx-metrics.spool.flush-interval {SECONDS} -1"),
        ({"influxdb.timeout": 0}, f"influx-metrics.influxdb.timeout {SECONDS} 0"),
        ({"influxdb.timeout": -2.5}, f"influx-metrics.influxdb.timeout {SECONDS} -2.5"),
        ({"influxdb.timeout": "inf"}, f"influx-metrics.influxdb.timeout {SECONDS} 'inf'"),
        ({"gpu.count": 65}, "influx-metrics.gpu.count must be an integer from 1 to 64, got 65"),
        ({"gpu.count": 2.5}, "influx-metrics.gpu.count must be an integer from 1 to 64, got 2.5"),
        ({"influxdb.url": "ftp://db:8086"}, f"{URL} with a host, e.g. http://127.0.0.1:8086, got 'ftp://db:8086'"),
        ({"influxdb.url": "127.0.0.1:8086"}, URL),
        ({"influxdb.url": "http://"}, URL),
        ({"influxdb.url": "", "sink": "http"}, "influx-metrics.influxdb.url must be set for the http sink, got ''"),
        ({"influxdb.database": ""}, "influx-metrics.influxdb.database must be a non-empty string, got ''"),
        ({"polling_intervall": 5}, "unknown influx-metrics setting(s) ['polling_intervall']"),
        (
            {"telegraf.max-datagram": 65508},
            "influx-metrics.telegraf.max-datagram must be 'auto' or a number of bytes from 1 to 65507, got 65508",
        ),
        ({"telegraf.max-datagram": "big"}, "telegraf.max-datagram must be 'auto' or a number of bytes"),
    ],
)
def test_values_that_cannot_be_honoured_are_refused(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings.resolve(overrides)


def test_max_datagram_is_auto_or_bytes():
    assert Settings.resolve().max_datagram is None  # auto: the UDP sink picks by the Telegraf address
    assert Settings.resolve({"telegraf.max-datagram": "auto"}).max_datagram is None
    assert Settings.resolve({"telegraf.max-datagram": "9000"}).max_datagram == 9000


def test_empty_url_is_fine_without_the_http_sink():
    assert Settings.resolve({"influxdb.url": "", "sink": "udp"}).influxdb_url == ""


# A 64-character label is not a valid host name: the lookup fails here, without asking a DNS server.
UNRESOLVABLE = "x" * 64 + ".invalid:8094"


def test_session_refuses_a_telegraf_host_that_does_not_resolve():
    assert Settings.resolve({"sink": "udp", "telegraf.address": UNRESOLVABLE})  # workers never look it up
    with pytest.raises(
        ValueError, match=re.escape("influx-metrics.telegraf.address names a host that does not resolve (")
    ) as e:
        Settings.for_session({"sink": "udp", "telegraf.address": UNRESOLVABLE})
    assert str(e.value).endswith(f"got {UNRESOLVABLE!r}")
    assert Settings.for_session({"sink": "udp", "telegraf.address": "localhost:8094"}).sinks == ("udp",)


def test_telegraf_host_is_only_looked_up_for_the_udp_sink():
    assert Settings.for_session({"sink": "spool", "telegraf.address": UNRESOLVABLE}).sinks == ("spool",)


@pytest.mark.parametrize(
    "tags, message",
    [
        ({"time": "x"}, "'time'.*reserved"),
        ({"status": "x"}, "'status'.*reserved"),
        ({"running": "x"}, "'running'.*reserved"),  # a field name: queries could not tell them apart
        ({"cpu_percent": "x"}, "'cpu_percent'.*reserved"),
        ({"_start": "x"}, "'_start'.*reserved"),
        ({"": "x"}, "empty tag key"),
        ({"run": ""}, "'run'.*empty"),
        ({"run": None}, "'run'.*empty"),
        ({"run": "x" * 1025}, "'run'.*1025 bytes.*1024"),
        ({"k" * 1025: "x"}, "1025 bytes.*1024"),
        ({"run": "ends in \\"}, "'run'.*backslash"),
        ({"run": {"nested": 1}}, "'run'.*str"),
        # issue 23 item 11: stored as a space, the Monitor could no longer read its own session
        ({"run": "a\nb"}, r"'run'.*control character\(s\) '\\n'.*read back"),
        ({"run": "tab\there\x7f"}, r"'run'.*'\\t', '\\x7f'"),
        ({"r\x01un": "x"}, "tag key.*control character"),
        (["run"], "mapping"),
    ],
)
def test_bad_tags_are_refused_naming_the_tag(tags, message):
    with pytest.raises(ValueError, match=message):
        Settings.resolve({"tags": tags})


def test_good_tags_pass_unchanged():
    tags = {"run": "nightly 2", "cluster": "prod-a", "n": 3, "note": 'sp ace,com=ma "quo\\te" ünï'}
    assert Settings.resolve({"tags": tags}).tags == {k: str(v) for k, v in tags.items()}


def test_an_unparsable_tags_environment_variable_is_an_error(monkeypatch):
    monkeypatch.setenv("DASK_INFLUX_METRICS__TAGS", "abc")
    dask.config.refresh()
    try:
        with pytest.raises(ValueError, match="DASK_INFLUX_METRICS__TAGS.*'abc'"):
            Settings.resolve()
        monkeypatch.setenv("DASK_INFLUX_METRICS__TAGS", "{'run': 'x'}")
        dask.config.refresh()
        assert Settings.resolve().tags == {"run": "x"}
    finally:
        monkeypatch.delenv("DASK_INFLUX_METRICS__TAGS")
        dask.config.refresh()


# --- issue 24: the spellings Dask and YAML turn into None/False, and typos that must be refused
@pytest.mark.parametrize("text", ["none", "None", "null"])
def test_gpu_source_none_from_the_environment(monkeypatch, text):
    """Dask reads ``none`` from the environment as None: it must still mean gpu.source none."""
    monkeypatch.setenv("DASK_INFLUX_METRICS__GPU__SOURCE", text)
    dask.config.refresh()
    try:
        assert Settings.resolve().gpu_source == "none"
    finally:
        monkeypatch.delenv("DASK_INFLUX_METRICS__GPU__SOURCE")
        dask.config.refresh()


@pytest.mark.parametrize(
    "document, attr, value",
    [
        ("gpu: {source: none}", "gpu_source", "none"),
        ("gpu: {source: null}", "gpu_source", "none"),
        ("gpu: {source: off}", "gpu_source", "none"),  # YAML 1.1: off is False
        ("dag-tag: off", "dag_tag", False),
        ("dag-tag: yes", "dag_tag", True),
        ("sampler: {mode: thread}", "sampler_mode", "thread"),
        ("tracking: null", "tracking", None),
        ("tags: null", "tags", {}),
        ("telegraf: {max-datagram: null}", "max_datagram", None),
        ("influxdb: {retention-policy: none}", "retention_policy", "none"),
    ],
)
def test_none_null_off_spellings_from_yaml(document, attr, value):
    def dotted(node, prefix="influx-metrics"):
        if not isinstance(node, dict) or not node:
            return {prefix: node}
        return {k: v for key, sub in node.items() for k, v in dotted(sub, f"{prefix}.{key}").items()}

    with dask.config.set(dotted(yaml.safe_load(document))):
        got = getattr(Settings.resolve(), attr)
    assert got == value or (value is None and got == tuple(config.schema.TRACKING))


@pytest.mark.parametrize(
    "name, text, attr, value",
    [
        ("DASK_INFLUX_METRICS__DAG_TAG", "off", "dag_tag", False),
        ("DASK_INFLUX_METRICS__DAG_TAG", "False", "dag_tag", False),
        ("DASK_INFLUX_METRICS__DAG_TAG", "yes", "dag_tag", True),
        ("DASK_INFLUX_METRICS__TAGS", "none", "tags", {}),
        ("DASK_INFLUX_METRICS__TELEGRAF__ADDRESS", "none", "telegraf_address", ("127.0.0.1", 8094)),
        ("DASK_INFLUX_METRICS__TRACKING", "null", "tracking", None),
    ],
)
def test_none_null_off_spellings_from_the_environment(monkeypatch, name, text, attr, value):
    monkeypatch.setenv(name, text)
    dask.config.refresh()
    try:
        got = getattr(Settings.resolve(), attr)
    finally:
        monkeypatch.delenv(name)
        dask.config.refresh()
    assert got == value or (value is None and got == tuple(config.schema.TRACKING))


def test_polling_interval_has_an_upper_bound():
    assert Settings.resolve({"polling-interval": 60_000}).polling_interval == 60_000
    with pytest.raises(ValueError, match=r"polling-interval must be a number of ms from 1 to 60000, got 1000000000"):
        Settings.resolve({"polling-interval": 10**9})


def test_a_dask_config_reset_resolves_every_missing_key_to_its_default():
    """Issue 48: a program (distributed's test suite) puts back a copy of dask.config taken before this package
    was imported, dropping the defaults it registered: a missing key is the table's default, never None."""
    expected = Settings.resolve()
    saved = dask.config.config.copy()
    try:
        dask.config.config.pop("influx-metrics", None)
        assert dask.config.get("influx-metrics.polling-interval", default=None) is None
        assert Settings.resolve() == expected
        assert Settings.resolve({"polling-interval": 50}).polling_interval == 50
        assert config.overrides_from_kwargs(mem_limit=10)["sink"] == ["auto", "spool"]
        assert [config.value(s.key) for s in config.SETTINGS] == [s.default for s in config.SETTINGS]
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def test_the_sampling_agent_imports_no_dask():
    """The host agent starts with its settings resolved: without Dask, it is ready in half the time."""
    import subprocess
    import sys

    code = "import sys, dask_influx_metrics.agent.process; print(sorted(m for m in sys.modules if m.split('.')[0] == 'dask'))"
    env = {**os.environ, config.AGENT_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
