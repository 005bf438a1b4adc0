"""CSV: ``Monitor.peaks_from_csv`` on the older tool's real GPU-BDB output vs plain pandas.

The data: ``../shared/data/gpubdb-csv.tgz`` beside the repository (16 files
``worker_<i>.csv``, ~172k rows, 8 GPUs, per-GPU cells ``"v0, v1, ..."``),
unpacked here into a temporary folder; without it the benchmark is skipped
with a message (no row). Alternated, for one metric (``compute-util``):

- **ours**: ``Monitor.peaks_from_csv(dir, metric, per_job=False)``, and with ``per_job=True``;
- **plain pandas**: per file ``read_csv(usecols=[metric])``, ``str.split(",", expand=True)``,
  ``astype(float).max()`` (the per-GPU maxima, nothing else).

Ours must equal the plain maxima exactly (ints kept) and take at most 1.5x its time.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import time

from benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHIVE = os.path.join(ROOT, "..", "shared", "data", "gpubdb-csv.tgz")
METRIC = "compute-util"


def _unpack(directory: str) -> str:
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(directory, filter="data")
    for root, _, files in os.walk(directory):
        if any(f.startswith("worker_") and f.endswith(".csv") for f in files):
            return root
    raise FileNotFoundError(f"no worker_<i>.csv files in {ARCHIVE}")


def _plain(folder: str, n: int) -> list:
    import pandas as pd

    out = []
    for i in range(n):
        column = pd.read_csv(os.path.join(folder, f"worker_{i}.csv"), usecols=[METRIC])[METRIC]
        out.append(column.str.split(",", expand=True).astype(float).max().tolist())
    return out


def _timed(fn, results: dict, key: str) -> float:
    t0 = time.perf_counter()
    results[key] = fn()
    return time.perf_counter() - t0


def run(quick: bool) -> list[dict]:
    from dask_influx_metrics.client import csvfiles
    from dask_influx_metrics.client.monitor import Monitor

    if not os.path.isfile(ARCHIVE):
        print(f"csvpeaks: skipped, {os.path.normpath(ARCHIVE)} is not there (the real GPU-BDB CSV output)")
        return []
    rounds = 3 if quick else 7
    with tempfile.TemporaryDirectory(prefix="gpubdb-") as tmp:
        folder = _unpack(tmp)
        n = len(csvfiles.csv_files(folder))
        rows = sum(1 for i in range(n) for _ in open(os.path.join(folder, f"worker_{i}.csv"))) - n
        got: dict = {}
        times = common.alternate({
            "ours": lambda: _timed(lambda: Monitor.peaks_from_csv(folder, METRIC, per_job=False), got, "ours"),
            "per_job": lambda: _timed(lambda: Monitor.peaks_from_csv(folder, METRIC, per_job=True), got, "per_job"),
            "plain": lambda: _timed(lambda: _plain(folder, n), got, "plain"),
        }, rounds)
    ours, per_job, plain = (common.median(times[k]) for k in ("ours", "per_job", "plain"))
    equal = got["ours"] == got["plain"] and all(isinstance(v, int) for w in got["ours"] for v in w)
    return [
        common.row("csvpeaks", f"peaks_from_csv {METRIC}, GPU-BDB: {n} files, {rows:,} rows (whole session)",
                   ours, "s", baseline=plain, target="<= 1.5x plain pandas", met=ours <= 1.5 * plain and equal,
                   notes=f"plain pandas (read_csv one column, split, max) {plain:.2f} s; equal to it, ints kept: "
                         f"{equal}; per job: {per_job:.2f} s; median of {rounds} alternated runs",
                   details={k: v for k, v in times.items()}),
    ]


if __name__ == "__main__":
    common.standalone("csvpeaks", run)
