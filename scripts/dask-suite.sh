#!/usr/bin/env bash
# Distributed's own tests with the monitor's --preload on every scheduler (issue 48): fails on a test that
# passes without the monitor, or on a scheduler left unmonitored (scripts/dask_suite.py says how it decides).
# CI runs its subset (SUBSET in scripts/dask_suite.py, ~2 min on 2 cores); --all runs the ten files of the
# issue, --plain runs without the monitor; other arguments name test files or ids.
# Those tests ship in neither distributed's wheel nor its sdist: the source is
# ../shared/data/distributed-src-40fcd99a8.tar.gz (how it was run: the README beside it). Without that file
# this says so and exits 0. It runs in a venv of its own (.venv-dask-suite, git-ignored) with the dask that
# source pins, the source itself (editable) and this package.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHIVE=../shared/data/distributed-src-40fcd99a8.tar.gz
PINNED=2026.7.0  # the source's pyproject asks for dask >=2026.7.0,<2026.7.1
VENV=.venv-dask-suite
SRC="$VENV/distributed-src"
if [ ! -f "$ARCHIVE" ]; then
  echo "dask-suite: skipped: $ARCHIVE is not there (distributed's own tests at commit 40fcd99a8, expected in shared/data/ beside the checkout)"
  exit 0
fi
if [ ! -f "$VENV/ready" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  mkdir -p "$SRC"
  tar -xzf "$ARCHIVE" -C "$SRC"
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  "${PIP[@]}" "dask==$PINNED"
  SETUPTOOLS_SCM_PRETEND_VERSION_FOR_DISTRIBUTED="$PINNED.post1" "${PIP[@]}" --no-deps -e "$SRC"
  "${PIP[@]}" -e . pytest pytest-timeout pytest-rerunfailures pytest-repeat bokeh pyarrow
  touch "$VENV/ready"
fi
exec "$VENV/bin/python" scripts/dask_suite.py --python "$VENV/bin/python" --src "$SRC" "$@"
