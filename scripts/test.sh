#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the whole test suite.
# Tests start their own influxd on free loopback ports; under CI=true a
# missing influxd fails the run instead of skipping.
# With no arguments it then runs the Dask-facing tests again on the older Dask
# RAPIDS 26.10 pins (OLD_DASK), in a second venv (.venv-dask$OLD_DASK, git-ignored), and
# a subset of distributed's own test suite with the monitor's --preload on every scheduler
# (scripts/dask-suite.sh, its own venv; skipped, saying why, without ../shared/data/).
# Arguments go to the main pytest run, and skip those runs.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD_DASK=2026.7.1
DASK_TESTS=(tests/test_dask_private.py tests/test_jobs.py tests/test_monitor.py tests/test_monitor_analysis.py
            tests/test_preload.py tests/test_agent.py tests/test_taskstream.py tests/test_worker_plugin.py
            tests/test_summary_nodes.py tests/test_worker_heartbeat.py tests/test_dashboard.py tests/test_names.py)
VERSIONS='import sys, dask, distributed
print(f"Python {sys.version.split()[0]}, dask {dask.__version__}, distributed {distributed.__version__}")'

bash scripts/setup.sh
.venv/bin/python -c "$VERSIONS"
.venv/bin/ruff check .           # lint (pyproject.toml [tool.ruff])
.venv/bin/ruff format --check .  # and formatting
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -rs "$@"
fi
.venv/bin/python -m pytest -q -rs   # -rs: every skip printed with its reason

OLD=".venv-dask$OLD_DASK"
[ -x "$OLD/bin/python" ] || python3 -m venv "$OLD"
"$OLD/bin/python" -m pip install -q --disable-pip-version-check -e ".[report]" pytest nvidia-ml-py \
  "dask[distributed,array]==$OLD_DASK" "distributed==$OLD_DASK"
"$OLD/bin/python" -c "$VERSIONS"
"$OLD/bin/python" -m pytest -q -rs "${DASK_TESTS[@]}"

exec bash scripts/dask-suite.sh  # distributed's own tests, monitored: ~2 min on 2 cores
