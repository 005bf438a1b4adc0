"""Shared fixtures: a private InfluxDB 1.x server (``influxd``) and fresh databases."""

from __future__ import annotations

import os
import uuid

import pytest

from dask_influx_metrics import localinflux as _influxd


@pytest.fixture(scope="session")
def influxd():
    """A running ``influxd`` on 127.0.0.1 (HTTP + a UDP listener into ``dask_metrics``).

    Skips when the binary is missing, unless ``CI=true``, where that fails.
    """
    if not _influxd.available():
        message = f"influxd not found at {_influxd.INFLUXD} (Debian package 'influxdb')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    server = _influxd.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_db(influxd) -> str:
    """The name of a new, empty database on the session's ``influxd``."""
    return influxd.create_database("test_" + uuid.uuid4().hex[:12])
