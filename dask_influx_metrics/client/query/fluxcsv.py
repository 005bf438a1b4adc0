"""InfluxDB's annotated CSV (Flux answers) -> pandas: column-wise, so times keep their nanoseconds and tag
values stay strings; an error table raises (see :mod:`.flux`)."""

from __future__ import annotations

import csv
import io
from typing import Optional

import pandas as pd

from .base import QueryError


def _column(values: pd.Series, datatype: str) -> pd.Series:
    values = values.where(values != "")  # empty cell = null
    if datatype.startswith("dateTime"):
        times = pd.to_datetime(values, utc=True, format="ISO8601")
        # RFC3339Nano drops trailing zeros: without a sub-microsecond digit pandas picks a coarser unit
        return (
            pd.Series(pd.DatetimeIndex(times).as_unit("ns").asi8, index=values.index) if times.notna().all() else times
        )
    if datatype in ("double", "long", "unsignedLong"):
        return pd.to_numeric(values).astype(float) if datatype == "double" else pd.to_numeric(values)
    if datatype == "boolean":
        return values.map({"true": True, "false": False})
    return values  # strings stay object columns, as the InfluxQL backend's read_csv(dtype=str) gives


def _table(rows: list, query: str) -> Optional[pd.DataFrame]:
    annotations = {r[0]: r for r in rows if r and r[0].startswith("#")}
    body = [r for r in rows if not (r and r[0].startswith("#"))]
    if not body:
        return None
    header, data = body[0], body[1:]
    if [c for c in header if c] == ["error", "reference"]:  # a failure after the answer began
        at = header.index("error")
        message = data[0][at] if data and len(data[0]) > at else "unknown error"
        raise QueryError(f"InfluxDB failed the Flux query: {message}\n{query}")
    types = annotations.get("#datatype", [])
    frame = pd.DataFrame(data, columns=header, dtype=object)
    out = {
        c: _column(frame.iloc[:, j], types[j] if j < len(types) else "string")
        for j, c in enumerate(header)
        if c not in ("", "result", "table")
    }
    return pd.DataFrame(out, index=frame.index)


def read_annotated_csv(text: str, query: str = "") -> pd.DataFrame:
    """All tables of a Flux CSV answer as one frame (tags as str, times as int ns, nulls as NaN).

    Tables with a new schema start after a blank line with their own
    annotations and header; an ``error,reference`` table raises QueryError.
    """
    tables, block = [], []
    for row in [*csv.reader(io.StringIO(text)), []]:
        if row:
            block.append(row)
        elif block:
            tables.append(_table(block, query))
            block = []
    tables = [t for t in tables if t is not None and not t.empty]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
