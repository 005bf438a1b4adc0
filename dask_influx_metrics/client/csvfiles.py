"""CSV export and import in the old dask-metrics layout.

One file per worker, ``<fname>_<i>.csv``, where ``i`` is the worker's index
in address order (the same numbering as ``workers=[...]`` everywhere). Columns:
``job, dag, timestamp``, then one column per metric; a per-GPU metric holds
all GPUs in one cell as ``"v0, v1, ..."``. Two columns the old tool did not
write come last: ``running`` (the executing task keys, JSON) when collected,
and ``worker`` (the address). ``workers.csv`` beside them maps index ->
address -> file.

The ``worker`` column, which we always write, tells our files from the old
tool's: a file without it is read with the old tool's job rule (every row of a
job counts for it, :class:`~dask_influx_metrics.jobtags.Rule`), because that
tool's ``dag`` column lagged behind the work; ours keep the busy-only rule.

>>> import pandas as pd, pathlib, tempfile, os
>>> t = pd.DataFrame({"job": ["1"], "dag": ["1"], "timestamp": [0.5], "x[0]": [1.0], "x[1]": [2.5]})
>>> t.attrs = {"worker": "tcp://h:1", "worker_index": 0}
>>> d = tempfile.mkdtemp()
>>> [os.path.basename(p) for p in write_tables([t], d)]
['worker_0.csv', 'workers.csv']
>>> pathlib.Path(d, "worker_0.csv").read_text().splitlines()[1]
'1,1,0.5,"1, 2.5",tcp://h:1'
>>> read_worker_csv(os.path.join(d, "worker_0.csv"))["x[1]"].tolist()
[2.5]
>>> import shutil; shutil.rmtree(d)
"""

from __future__ import annotations

import glob
import io
import math
import os
import re
from typing import Callable, Optional

import numpy as np
import pandas as pd

from .. import jobtags, schema
from .query.base import QueryError
from .query.store import NO_GPU, Store
from .tables import BASE_COLUMNS, device_columns, table_metrics, worker_tables

MANIFEST = "workers.csv"
EXTRA_COLUMNS = ("running", "worker")


def _num(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "nan"
    if isinstance(v, (float, np.floating)) and float(v).is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v)) if isinstance(v, (float, np.floating)) else str(v)


def to_old_layout(table: pd.DataFrame) -> pd.DataFrame:
    """A table (see :mod:`~dask_influx_metrics.client.tables`) as the old CSV columns."""
    out = pd.DataFrame({c: table[c].to_numpy() for c in BASE_COLUMNS})
    for metric in table_metrics(table):
        cols = device_columns(table, metric)
        if cols == [metric]:
            out[metric] = [_num(v) for v in table[metric].to_numpy()]
        else:
            values = table[cols].to_numpy(dtype=float)
            out[metric] = [", ".join(_num(v) for v in row) for row in values]
    if "running" in table.columns:
        out["running"] = table["running"].fillna("").to_numpy()
    out["worker"] = table.attrs.get("worker", "")
    return out


def write_tables(
    tables: list[pd.DataFrame],
    directory,
    fname: str = "worker",
    clear_dir: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
) -> list[str]:
    """Write each table to ``<directory>/<fname>_<worker_index>.csv`` plus ``workers.csv``.

    ``clear_dir`` first removes the ``<fname>_*.csv`` files already there
    (only those). ``progress(done, total)`` is called after each file.
    Returns the paths written: the worker files in index order, then ``workers.csv``.
    """
    directory = os.fspath(directory)
    if not re.fullmatch(r"[\w.-]+", fname):
        raise ValueError(f"fname {fname!r} must be a plain file name prefix (letters, digits, '_', '-', '.')")
    os.makedirs(directory, exist_ok=True)
    if clear_dir:
        for old in glob.glob(os.path.join(directory, f"{glob.escape(fname)}_*.csv")):
            os.remove(old)
    paths, manifest = [], []
    for done, table in enumerate(tables, 1):
        i = int(table.attrs.get("worker_index", done - 1))
        path = os.path.join(directory, f"{fname}_{i}.csv")
        to_old_layout(table).to_csv(path, index=False)
        paths.append(path)
        manifest.append(
            {"index": i, "worker": table.attrs.get("worker", ""), "file": os.path.basename(path), "rows": len(table)}
        )
        if progress:
            progress(done, len(tables))
    paths.append(os.path.join(directory, MANIFEST))
    pd.DataFrame(manifest, columns=["index", "worker", "file", "rows"]).to_csv(paths[-1], index=False)
    return paths


def to_csv(
    store: Store,
    path,
    fname: str = "worker",
    clear_dir: bool = False,
    metrics=None,
    workers=None,
    job: Optional[int] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> list[str]:
    """One CSV per worker of ``store`` in the old layout, then ``workers.csv`` (:func:`write_tables`);
    returns their paths."""
    tables = worker_tables(store, job=job, metrics=metrics, workers=workers, progress=progress)
    empty = [w for w, t in tables.items() if t.empty]
    if empty:  # a header-only file would pass for an export
        kept = store.kept_gpu(metrics)
        raise QueryError(
            f"no samples for worker(s) {empty} {store.scope()}; no CSV written ("
            + (kept if kept else f"a worker without a GPU writes no GPU samples: {NO_GPU}")
            + ")"
        )
    return write_tables(list(tables.values()), path, fname=fname, clear_dir=clear_dir)


def _bad(path, row: int, message: str) -> ValueError:
    return ValueError(f"{path}, line {row + 2}: {message}")  # +1 header, +1 one-based


def _floats(path, column: str, cells: pd.Series) -> np.ndarray:
    parts = cells.str.split(",")
    widths = parts.str.len()
    if widths.nunique() > 1:
        row = int(np.argmax(widths.to_numpy() != widths.iloc[0]))
        raise _bad(path, row, f"column {column!r} has {widths.iloc[row]} values, earlier rows have {widths.iloc[0]}")
    flat = parts.explode().str.strip()
    values = pd.to_numeric(flat, errors="coerce").to_numpy(dtype=float)
    bad = np.isnan(values) & ~flat.str.lower().isin(["nan", ""]).to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0]) // int(widths.iloc[0])
        raise _bad(path, row, f"column {column!r}: {cells.iloc[row]!r} is not a number or a list of numbers")
    return values.reshape(len(cells), int(widths.iloc[0]))


def _fast_floats(cells: pd.Series) -> Optional[np.ndarray]:
    """Cells of comma-separated numbers as a (rows, values) array, parsed in C; None when any
    cell is malformed (then :func:`_floats` finds and names it)."""
    if cells.str.len().eq(0).any():
        return None  # an empty cell: a blank line to loadtxt
    try:
        values = np.loadtxt(io.StringIO("\n".join(cells)), delimiter=",", ndmin=2, dtype=float)
    except ValueError:
        return None
    return values if len(values) == len(cells) else None


def _gpu_metric(name: str) -> bool:
    """A metric that is per GPU even when a worker has one GPU (no comma in its cells)."""
    pairs = schema.TRACKING.get(name) or ((name.split(".", 1)[0], ""),)
    return all(m == schema.GPU for m, _ in pairs)


def read_worker_csv(path, metrics=None) -> pd.DataFrame:
    """One worker's CSV (old layout, or ours) -> a table with ``<metric>[<i>]`` columns.

    ``metrics`` (names) reads only those columns besides ``job, dag,
    timestamp``; default: every column. ``attrs["job_rule"]`` says which rows
    count for a job (see the module docstring). Raises ``ValueError`` naming
    the file and line of the first malformed row.
    """
    path = os.fspath(path)
    try:
        head = pd.read_csv(path, dtype=str, keep_default_na=False, nrows=1)
        wanted = None if metrics is None else set(BASE_COLUMNS) | set(metrics)
        raw = pd.read_csv(
            path,
            dtype=str,
            keep_default_na=False,
            usecols=None if wanted is None else [c for c in head.columns if c in wanted],
        )
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable CSV file: {e}") from None
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: empty file, expected a header with {list(BASE_COLUMNS)}") from None
    missing = [c for c in BASE_COLUMNS if c not in raw.columns]
    if missing:
        raise ValueError(f"{path}, line 1: missing column(s) {missing}; found {list(head.columns)}")
    table = pd.DataFrame({"job": raw["job"], "dag": raw["dag"]})
    table["timestamp"] = _parse(path, "timestamp", raw["timestamp"])[:, 0] if len(raw) else []
    for column in raw.columns:
        if column in BASE_COLUMNS or column in EXTRA_COLUMNS:
            continue
        cells = raw[column]
        values = _parse(path, column, cells) if len(raw) else np.empty((0, 1))
        if values.shape[1] == 1 and not _gpu_metric(column) and not cells.str.contains(",").any():
            table[column] = values[:, 0]
        else:
            for i in range(values.shape[1]):
                table[f"{column}[{i}]"] = values[:, i]
    if "running" in raw.columns:
        table["running"] = raw["running"]
    if "tasks" in table.columns:
        table["tasks"] = table["tasks"].astype("Int64")
    number = re.search(r"_(\d+)\.csv$", os.path.basename(path))
    ours = "worker" in head.columns  # the column we always write; the old tool never did
    worker = head["worker"].iloc[0] if ours and len(head) else ""
    table.attrs = {
        "worker": worker or os.path.basename(path),
        "worker_index": int(number.group(1)) if number else 0,
        "units": {},
        jobtags.RULE: jobtags.Rule.BUSY if ours else jobtags.Rule.EVERY_ROW,
    }
    return table


def _parse(path, column: str, cells: pd.Series) -> np.ndarray:
    values = _fast_floats(cells)
    return values if values is not None else _floats(path, column, cells)


def file_metrics(path) -> list[str]:
    """The metric columns a CSV file's header names (read from its first line only)."""
    columns = pd.read_csv(os.fspath(path), dtype=str, nrows=0).columns
    return [c for c in columns if c not in BASE_COLUMNS and c not in EXTRA_COLUMNS]


def csv_files(directory, fname: str = "worker") -> dict[int, str]:
    """``{worker index: path}`` of ``<fname>_<i>.csv`` files in ``directory``, by number.

    >>> csv_files("/nonexistent")
    {}
    """
    pattern = re.compile(rf"^{re.escape(fname)}_(\d+)\.csv$")
    found = {}
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            m = pattern.match(name)
            if m:
                found[int(m.group(1))] = os.path.join(directory, name)
    return dict(sorted(found.items()))


def read_tables(directory, workers=None, fname: str = "worker", metrics=None) -> list[pd.DataFrame]:
    """Tables of ``workers`` (indices; default all) from a directory written by :func:`write_tables`.

    ``workers=[2]`` reads ``worker_2.csv``, never ``worker_10.csv``; ``metrics``
    reads only those columns (see :func:`read_worker_csv`).
    """
    files = csv_files(directory, fname)
    if not files:
        raise FileNotFoundError(f"no {fname}_<n>.csv files in {os.fspath(directory)!r}")
    wanted = list(files) if workers is None else list(workers)
    missing = [w for w in wanted if w not in files]
    if missing:
        raise ValueError(f"worker(s) {missing} not in {os.fspath(directory)!r}; present: {list(files)}")
    return [read_worker_csv(files[w], metrics) for w in wanted]
