#!/usr/bin/env bash
# Set up a fresh Debian machine for dask-influx-metrics: InfluxDB 1.x from the
# Debian package (influxd; we start our own instances on loopback, never the
# system service), Chromium (headless, for the report test), a virtualenv in
# .venv, and this package with its extras.
set -euo pipefail
cd "$(dirname "$0")/.."
apt_for() {  # apt_for COMMAND PACKAGE [APT-GET OPTION...]: install the Debian package when COMMAND is missing
  command -v "$1" >/dev/null 2>&1 && return 0
  local package="$2"; shift 2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" "$package" >/dev/null
}
apt_for influxd influxdb
# Prometheus for tests/test_accounting_cluster.py (started on a free loopback port with its own config and
# storage; never the system service); without the exporters it recommends.
apt_for prometheus prometheus --no-install-recommends
apt_for chromium chromium  # headless, for tests/test_report.py: the HTML report as a person sees it
# `docker-compose config` checks deploy/compose in tests/test_deploy.py (no engine needed): Debian's
# docker-compose (1.29.2 on Debian 12), without the Docker engine it recommends.
apt_for docker-compose docker-compose --no-install-recommends
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
# The Flux checker used by tests/test_flux.py: the Flux language server compiled to
# wasm (npm @influxdata/flux-lsp-node), pinned, into the git-ignored .tools/flux.
FLUX_LSP_VERSION=0.8.40
FLUX_LSP_DIR=.tools/flux
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi
installed=$(node -p "try { require('./$FLUX_LSP_DIR/node_modules/@influxdata/flux-lsp-node/package.json').version } catch (e) { '' }")
if [ "$installed" != "$FLUX_LSP_VERSION" ]; then
  npm install --prefix "$FLUX_LSP_DIR" --no-audit --no-fund --save-exact --loglevel=error \
    "@influxdata/flux-lsp-node@$FLUX_LSP_VERSION"
fi

# The Grafana dashboard check used by tests/test_grafana.py: Grafana's own dashboard
# types (npm @grafana/schema, generated from its CUE schema) and the TypeScript
# compiler that checks the generated JSON against them, pinned, into .tools/grafana.
GRAFANA_SCHEMA_VERSION=13.2.3
TYPESCRIPT_VERSION=5.9.3
GRAFANA_DIR=.tools/grafana
installed=$(node -p "try { require('./$GRAFANA_DIR/node_modules/@grafana/schema/package.json').version + ' ' + require('./$GRAFANA_DIR/node_modules/typescript/package.json').version } catch (e) { '' }")
if [ "$installed" != "$GRAFANA_SCHEMA_VERSION $TYPESCRIPT_VERSION" ]; then
  npm install --prefix "$GRAFANA_DIR" --no-audit --no-fund --save-exact --loglevel=error \
    "@grafana/schema@$GRAFANA_SCHEMA_VERSION" "typescript@$TYPESCRIPT_VERSION"
fi
