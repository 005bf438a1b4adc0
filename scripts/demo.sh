#!/usr/bin/env bash
# Set up everything (scripts/setup.sh), then run the demo: a LocalCluster with
# simulated GPUs, a three-job workload, samples over UDP into a private influxd
# on loopback (spooled to disk instead if influxd cannot run), and a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m dask_influx_metrics.demo --local-influxd "$@"
