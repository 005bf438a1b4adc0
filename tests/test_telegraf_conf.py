"""deploy/telegraf/telegraf.conf: valid TOML, listens where workers send, outputs from env."""

from __future__ import annotations

import os
import re

import tomllib

from dask_influx_metrics.settingparsers import TELEGRAF_FALLBACK

CONF = os.path.join(os.path.dirname(__file__), "..", "deploy", "telegraf", "telegraf.conf")
ENV_REF = re.compile(r"\$\{(\w+)\}")


def _text() -> str:
    with open(CONF) as f:
        return f.read()


def _parse(text: str) -> dict:
    """TOML after Telegraf-style ``${VAR}`` substitution (with dummy values)."""
    return tomllib.loads(ENV_REF.sub(lambda m: f"dummy-{m.group(1).lower()}", text))


def _v1_alternative() -> str:
    """The commented InfluxDB 1.x output block, uncommented."""
    block = _text().split("# --- InfluxDB 1.x alternative", 1)[1]
    return "\n".join(
        line[2:]
        for line in block.splitlines()
        if line.startswith("# ") and (line.startswith("# [[") or line.startswith("#   "))
    )


def test_parses_and_listens_on_the_worker_default_port():
    conf = _parse(_text())
    _, port = TELEGRAF_FALLBACK  # where the udp sink sends when telegraf.address is not configured
    (listener,) = conf["inputs"]["socket_listener"]
    assert listener["service_address"] == f"udp://:{port}"
    assert listener["data_format"] == "influx"
    assert listener["read_buffer_size"].endswith("MiB") and int(listener["read_buffer_size"][:-3]) >= 8
    assert "internal" in conf["inputs"]
    assert conf["agent"]["metric_buffer_limit"] >= 1_000_000
    assert conf["agent"]["precision"] == "0s"


def test_v2_output_from_environment():
    conf = _parse(_text())
    assert set(conf["outputs"]) == {"influxdb_v2"}
    (out,) = conf["outputs"]["influxdb_v2"]
    assert (out["urls"], out["token"], out["organization"], out["bucket"]) == (
        ["dummy-influx_url"],
        "dummy-influx_token",
        "dummy-influx_org",
        "dummy-influx_bucket",
    )


def test_v1_alternative_parses_from_environment():
    conf = _parse(_v1_alternative())
    (out,) = conf["outputs"]["influxdb"]
    assert out["urls"] == ["dummy-influx_url"]
    assert out["password"] == "dummy-influx_password" and out["username"] == "dummy-influx_username"
    assert out["database"] == "dummy-influx_database"
