#!/usr/bin/env bash
# Set up a fresh Debian machine for dask-influx-metrics: InfluxDB 1.x from the
# Debian package (influxd; we start our own instances on loopback, never the
# system service), a virtualenv in .venv, and this package with its extras.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v influxd >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq influxdb >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
