"""CSV: ``Monitor.peaks_from_csv`` on the older tool's real GPU-BDB output vs plain pandas.

The data: ``../shared/data/gpubdb-csv.tgz`` beside the repository (16 files
``worker_<i>.csv``, ~172k rows, 8 GPUs, per-GPU cells ``"v0, v1, ..."``),
unpacked here into a temporary folder; without it the benchmark is skipped
with a message (no row). Alternated, for one metric (``compute-util``):

- **ours**: ``Monitor.peaks_from_csv(dir, metric, per_job=False)``, and with ``per_job=True``;
- **plain pandas**: per file ``read_csv(usecols=[metric])``, ``str.split(",", expand=True)``,
  ``astype(float).max()`` (the per-GPU maxima, nothing else); per job, the old tool's rule
  (these files are its own): ``read_csv(usecols=["job", metric])``, split, rows of job 0
  dropped, ``groupby("job").max()`` (every row of a job, whatever its ``dag``).

Ours must equal the plain maxima exactly (ints kept) and take at most 1.5x its time, whole
session and per job.
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


def _plain_per_job(folder: str, n: int) -> list:
    """The old tool's rule: per job every row of it, job 0 left out."""
    import pandas as pd

    out = []
    for i in range(n):
        raw = pd.read_csv(os.path.join(folder, f"worker_{i}.csv"), usecols=["job", METRIC])
        raw = raw[raw["job"] != 0]
        values = raw[METRIC].str.split(",", expand=True).astype(float)
        out.append({j: row.tolist() for j, row in values.groupby(raw["job"]).max().iterrows()})
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
        times = common.alternate(
            {
                "ours": lambda: _timed(lambda: Monitor.peaks_from_csv(folder, METRIC, per_job=False), got, "ours"),
                "per_job": lambda: _timed(lambda: Monitor.peaks_from_csv(folder, METRIC, per_job=True), got, "per_job"),
                "plain": lambda: _timed(lambda: _plain(folder, n), got, "plain"),
                "plain_per_job": lambda: _timed(lambda: _plain_per_job(folder, n), got, "plain_per_job"),
            },
            rounds,
        )
    ours, per_job, plain, plain_per_job = (
        common.median(times[k]) for k in ("ours", "per_job", "plain", "plain_per_job")
    )
    equal = got["ours"] == got["plain"] and all(isinstance(v, int) for w in got["ours"] for v in w)
    equal_per_job = got["per_job"] == got["plain_per_job"] and all(
        isinstance(v, int) for w in got["per_job"] for peaks in w.values() for v in peaks
    )
    what = f"peaks_from_csv {METRIC}, GPU-BDB: {n} files, {rows:,} rows"
    runs = f"median of {rounds} alternated runs"
    return [
        common.row(
            "csvpeaks",
            f"{what} (whole session)",
            ours,
            "s",
            baseline=plain,
            target="<= 1.5x plain pandas",
            met=ours <= 1.5 * plain and equal,
            notes=f"plain pandas (read_csv one column, split, max) {plain:.2f} s; equal to it, ints kept: "
            f"{equal}; {runs}",
            details={k: v for k, v in times.items()},
        ),
        common.row(
            "csvpeaks",
            f"{what} (per job, the old tool's rule: every row of a job)",
            per_job,
            "s",
            baseline=plain_per_job,
            target="<= 1.5x plain pandas",
            met=per_job <= 1.5 * plain_per_job and equal_per_job,
            notes=f"plain pandas (read_csv job + column, split, drop job 0, groupby job max) "
            f"{plain_per_job:.2f} s; equal to it, ints kept: {equal_per_job}; {runs}",
        ),
    ]


if __name__ == "__main__":
    common.standalone("csvpeaks", run)
