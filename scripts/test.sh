#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the whole test suite.
# Tests start their own influxd on free loopback ports; under CI=true a
# missing influxd fails the run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
