"""A fake InfluxDB 2.x that answers the Flux our backend generates from a list of points.

``answer_from(points)`` returns an ``answer(flux) -> (status, body)`` for
:class:`fake_influx2.FakeInflux`: it evaluates the ``range``/``filter`` of each
``from(bucket: ...)`` part (the predicate, rewritten as Python) over the
points, one row per field, then the step that follows (``distinct``,
``first``/``last``, ``pivot``, ``group |> max``) and writes the rows as
annotated CSV, one block per table schema. It understands only the query
shapes of ``dask_influx_metrics.client.query.flux`` (and plain test data: no
hostile strings).
"""

from __future__ import annotations

import numbers
import re

import pandas as pd

from dask_influx_metrics.client.query import fluxtext as F


class _Row(dict):
    def __missing__(self, key):
        return None


def _predicate(text: str):
    expr = re.sub(r'(r\["\w+"\]) =~ /(.*?)/', r'_match(\1, r"\2")', re.sub(r"\br\.(\w+)", r'r["\1"]', text))
    expr = re.sub(r'not exists (r\["\w+"\])', r"\1 is None", expr)
    code = compile(expr, "<flux filter>", "eval")
    return lambda r: eval(code, {"_match": lambda v, rx: v is not None and re.search(rx, v) is not None}, {"r": r})


def _rows(points) -> list[_Row]:
    return [
        _Row({"_measurement": p.measurement, "_field": f, "_value": v, "_time": p.time_ns, **p.tags})
        for p in points
        for f, v in p.fields.items()
    ]


def _part(rows: list[_Row], flux: str) -> pd.DataFrame:
    start, stop = re.search(r"range\(start: time\(v: (\d+)\), stop: (?:time\(v: (\d+)\)|1d)\)", flux).groups()
    keep = _predicate(re.search(r"filter\(fn: \(r\) => (.*)\)\n", flux).group(1))
    rows = [r for r in rows if int(start) <= r["_time"] < (int(stop) if stop else 2**63) and keep(r)]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    if m := re.search(r'map\(fn: \(r\) => \(\{measurement: "(\w+)"', flux):
        return pd.DataFrame({"measurement": m.group(1), "field": sorted(frame["_field"].unique())})
    if m := re.search(r'distinct\(column: "(\w+)"\)', flux):
        return (
            pd.DataFrame({"_value": sorted(frame[m.group(1)].dropna().unique())})
            if m.group(1) in frame
            else frame.iloc[:0]
        )
    if "limit(n: 1)" in flux and (m := re.search(r"group\(columns: \[(.*?)\]\)", flux)):
        return _edges(frame, flux, re.findall(r'"(\w+)"', m.group(1)))
    if "first()" in flux or "last()" in flux:
        return pd.DataFrame({"_time": [frame["_time"].min() if "first()" in flux else frame["_time"].max()]})
    if "max()" in flux:
        by = re.findall(r'"(\w+)"', re.search(r"group\(columns: \[(.*?)\]\)", flux).group(1))
        return (
            frame.fillna({c: "" for c in by if c in frame})
            .groupby([c for c in by if c in frame])["_value"]
            .max()
            .reset_index()
        )
    keep_cols = re.findall(r'"([^"]+)"', re.search(r"keep\(columns: \[(.*?)\]\)", flux).group(1))
    tags = [c for c in frame.columns if c not in ("_field", "_value", "_time")]
    series = frame.fillna({t: "<no tag>" for t in tags})
    wide = series.pivot_table(index=tags + ["_time"], columns="_field", values="_value", aggfunc="last")
    wide = wide.reset_index()
    for t in tags:
        wide[t] = wide[t].astype(object).where(wide[t] != "<no tag>", None)
    return wide[[c for c in keep_cols if c in wide.columns]]


def _edges(frame: pd.DataFrame, flux: str, by: list) -> pd.DataFrame:
    """``[first() or last() |>] keep |> group(columns: by) |> sort(_time) |> limit(n: 1)``: the first (with
    ``desc: true`` the last) time of each group; a group column a row lacks is null."""
    last = "desc: true" in flux
    if "first()" in flux or "last()" in flux:  # each series' edge point first (as storage does)
        series = [c for c in frame.columns if c not in ("_value", "_time")]
        frame = frame.fillna({c: "<none>" for c in series}).sort_values("_time")
        frame = frame.groupby(series).tail(1) if last else frame.groupby(series).head(1)
        frame = frame.replace("<none>", None)
    keyed = frame.reindex(columns=by + ["_time"]).astype({c: object for c in by})
    keyed = keyed.fillna({c: "<none>" for c in by})
    edges = keyed.groupby(by)["_time"].agg("max" if last else "min").reset_index()
    return edges.replace("<none>", None)


def _datatype(values: pd.Series) -> str:
    present = values.dropna()
    if values.name == "_time":
        return "dateTime:RFC3339"
    if len(present) and all(isinstance(v, bool) for v in present):
        return "boolean"
    if len(present) and all(isinstance(v, numbers.Integral) for v in present):
        return "long"
    if len(present) and all(isinstance(v, numbers.Real) for v in present):
        return "double"
    return "string"


def _cell(v, datatype: str) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if datatype.startswith("dateTime"):
        return pd.Timestamp(int(v), unit="ns", tz="UTC").isoformat().replace("+00:00", "Z")
    text = ("true" if v else "false") if datatype == "boolean" else str(int(v) if datatype == "long" else v)
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text


def to_annotated_csv(frame: pd.DataFrame) -> str:
    """One annotated CSV block (InfluxDB 2.x's shape: CRLF, an empty first header cell)."""
    if frame.empty:
        return "\r\n"
    frame = frame.astype(object).where(frame.notna(), None)
    types = [_datatype(frame[c]) for c in frame.columns]
    lines = [
        "#datatype,string,long," + ",".join(types),
        "#group,false,false" + ",false" * len(types),
        "#default,_result," + "," * len(types),
        ",result,table," + ",".join(frame.columns),
    ]
    lines += [",,0," + ",".join(_cell(v, t) for v, t in zip(row, types)) for row in frame.itertuples(index=False)]
    return "\r\n".join(lines) + "\r\n\r\n"


def answer_from(points, buckets=("dask_metrics",)):
    """An ``answer(flux)`` for FakeInflux that computes every answer from ``points``."""
    rows = _rows(points)

    def answer(flux: str) -> tuple[int, str]:
        if flux == F.BUCKETS_QUERY:
            return 200, to_annotated_csv(pd.DataFrame({"name": list(buckets)}))
        parts = [_part(rows, "from(bucket:" + p) for p in flux.split("from(bucket:")[1:]]
        parts = [p for p in parts if not p.empty]
        return 200, to_annotated_csv(pd.concat(parts, ignore_index=True) if parts else pd.DataFrame())

    return answer
