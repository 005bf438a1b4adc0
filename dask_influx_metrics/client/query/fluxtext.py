"""Flux text: each question the Flux backend (:mod:`.flux`) asks, as one script built by a pure function.

Filtered on the server (time range, worker, job, extra tags, the session read).

>>> string('a"b\\\\c${d}')
'"a\\\\"b\\\\\\\\c\\\\${d}"'
>>> print(flux_tag_values_query("db/rp", "job", {"run": "x"}, start_ns=5, stop_ns=None))
from(bucket: "db/rp")
    |> range(start: time(v: 5), stop: 1d)
    |> filter(fn: (r) => (r._measurement == "gpu" or r._measurement == "host" or r._measurement == "worker" or r._measurement == "custom") and r["run"] == "x")
    |> keep(columns: ["job"])
    |> group()
    |> distinct(column: "job")
<BLANKLINE>
"""

from __future__ import annotations

from typing import Optional

from ... import jobtags, schema
from .base import DEVICE_MEASUREMENTS, SAMPLE_MEASUREMENTS, SESSION_MEASUREMENTS
from .sessions import SESSION

DAG_COLUMNS = ["time", "job", "dag", "status", "event", "tasks", "label", "duration", SESSION]


_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def string(value) -> str:
    """A Flux string literal: backslash, quote, newline, CR, tab and ``${`` (interpolation) escaped."""
    return '"' + str(value).translate(_ESCAPES).replace("${", "\\${") + '"'


def _array(items) -> str:
    return "[" + ", ".join(string(i) for i in items) + "]"


def _any_of(column: str, values) -> str:
    terms = [f"{column} == {string(v)}" for v in values]
    return terms[0] if len(terms) == 1 else "(" + " or ".join(terms) + ")"


def _tag_is(key: str, value: str) -> str:
    """``r[key] == value``; ``""`` is a tag the point lacks (line protocol has no empty tag value), as
    InfluxQL's ``"key" = ''`` reads it.

    >>> _tag_is("session", "")
    '(not exists r["session"] or r["session"] == "")'
    """
    if value == "":
        return f'(not exists r[{string(key)}] or r[{string(key)}] == "")'
    return f"r[{string(key)}] == {string(value)}"


def predicate(measurements, tags=None, fields=None, workers=None, job: Optional[int] = None, busy: bool = False) -> str:
    """The body of ``filter(fn: (r) => ...)``; ``job`` matches inside comma-joined lists ("1,2").

    ``busy`` keeps busy samples only (``r.dag != "0"``).
    """
    terms = [_any_of("r._measurement", measurements)]
    if fields is not None:
        terms.append(_any_of("r._field", fields))
    terms += [_tag_is(k, v) for k, v in sorted((tags or {}).items())]
    if workers is not None:
        terms.append(_any_of("r.worker", workers))
    if job is not None:
        terms.append(f"r.job =~ {jobtags.flux_regex(job)}")
    if busy:
        terms.append(jobtags.FLUX_BUSY)
    return " and ".join(terms)


def _source(bucket: str, start_ns: Optional[int], stop_ns: Optional[int], where: str) -> str:
    # Flux's range needs a start and its stop is exclusive (InfluxQL's `time <= stop` is not):
    # stop + 1 ns. Without a stop: a day past the server's now(), so samples stamped by a
    # scheduler whose clock runs ahead of the server's still count.
    start = f"time(v: {int(start_ns or 0)})"
    stop = "1d" if stop_ns is None else f"time(v: {int(stop_ns) + 1})"
    return (
        f"from(bucket: {string(bucket)})\n    |> range(start: {start}, stop: {stop})\n"
        f"    |> filter(fn: (r) => {where})\n"
    )


def _pipe(*steps: str) -> str:
    return "".join(f"    |> {s}\n" for s in steps)


def flux_fields_query(bucket, tags=None, start_ns=None, stop_ns=None) -> str:
    """Field keys of each sample measurement, as (measurement, field) rows.

    Each part is ``schema.fieldKeys`` spelled out (keep/group/distinct, which
    2.x pushes down to one storage tag-values read): older Flux, as in
    InfluxDB 1.8, has no ``influxdata/influxdb/schema`` package.
    """
    parts = [
        _source(bucket, start_ns, stop_ns, predicate([m], tags))
        + _pipe(
            'keep(columns: ["_field"])',
            "group()",
            'distinct(column: "_field")',
            f"map(fn: (r) => ({{measurement: {string(m)}, field: r._value}}))",
        )
        for m in SAMPLE_MEASUREMENTS
    ]
    return "union(tables: [\n" + ",\n".join(p.rstrip("\n") for p in parts) + ",\n])\n"


def flux_tag_values_query(bucket, key, tags=None, start_ns=None, stop_ns=None) -> str:
    """Distinct values of tag ``key`` on sample points, in column ``_value``."""
    return _source(bucket, start_ns, stop_ns, predicate(SAMPLE_MEASUREMENTS, tags)) + _pipe(
        f"keep(columns: {_array([key])})", "group()", f"distinct(column: {string(key)})"
    )


def flux_first_time_query(bucket, tags=None, start_ns=None, stop_ns=None) -> str:
    """The earliest sample's ``_time``: first point of each series, then the earliest of those."""
    return _source(bucket, start_ns, stop_ns, predicate(SAMPLE_MEASUREMENTS, tags)) + _pipe(
        "first()", 'keep(columns: ["_time"])', "group()", 'sort(columns: ["_time"])', "limit(n: 1)"
    )


def flux_last_time_query(bucket, tags=None, start_ns=None, stop_ns=None) -> str:
    """The latest sample's ``_time`` (as :func:`flux_first_time_query`, from the other end)."""
    return _source(bucket, start_ns, stop_ns, predicate(SAMPLE_MEASUREMENTS, tags)) + _pipe(
        "last()", 'keep(columns: ["_time"])', "group()", 'sort(columns: ["_time"], desc: true)', "limit(n: 1)"
    )


def flux_session_query(bucket, keys, last=False, field=False, tags=None, start_ns=None, stop_ns=None) -> str:
    """The first (``last``: the last) point's ``_time`` of each group ``keys`` (``session`` and others) of
    the session measurements. ``field``: ``session`` is a field (``session-tag: false``): its values,
    grouped in ``_value``, every point read; else each series' first (last) point, then its group's.
    """
    edge, group = ("last()" if last else "first()"), [("_value" if k == SESSION and field else k) for k in keys]
    where = predicate(SESSION_MEASUREMENTS, tags, fields=[SESSION] if field else None)
    return _source(bucket, start_ns, stop_ns, where) + _pipe(
        *(() if field else (edge,)),
        f"keep(columns: {_array(['_time'] + group)})",
        f"group(columns: {_array(group)})",
        f'sort(columns: ["_time"]{", desc: true" if last else ""})',
        "limit(n: 1)",
    )


def flux_frame_query(
    bucket, measurement, fields, worker, job=None, tags=None, start_ns=None, stop_ns=None, dag_field=False, host=None
) -> str:
    """One worker's samples, one row per (time, series): pivot merges the fields of each series.

    Tables are series (one per tag set, so per device ``index`` and per job/DAG
    tags); ``pivot`` drops ``_field`` from the group key, so the fields of one
    series meet in one table and one row per time. ``dag_field``: ``dag`` is a
    field (``dag-tag: false``), read with the others. ``host`` (``worker=None``): every
    worker's points of that host, with their ``worker`` tag.
    """
    tag_cols = ["job", "dag"] + (["index"] if measurement in DEVICE_MEASUREMENTS else []) + (["worker"] if host else [])
    where = predicate(
        [measurement],
        {**(tags or {}), **({"host": host} if host else {})},
        fields=list(fields) + (["dag"] if dag_field else []),
        workers=None if worker is None else [worker],
        job=job,
    )
    return _source(bucket, start_ns, stop_ns, where) + _pipe(
        'pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")',
        f"keep(columns: {_array(['_time'] + tag_cols + list(fields))})",
    )


def flux_max_query(
    bucket,
    measurement,
    field,
    by,
    workers=None,
    job=None,
    tags=None,
    start_ns=None,
    stop_ns=None,
    busy=False,
    dag_field=False,
) -> str:
    """Server-side ``max`` of one field per group of tags ``by`` (of busy samples with ``busy``), in ``_value``.

    With ``busy`` and ``dag_field`` (``dag`` is a field, ``dag-tag: false``) the
    field and ``dag`` are pivoted into one row per point before the busy filter.
    """
    last = _pipe(f"group(columns: {_array(by)})", "max()", f"keep(columns: {_array(list(by) + ['_value'])})")
    if busy and dag_field:
        where = predicate([measurement], tags, fields=[field, "dag"], workers=workers, job=job)
        value = f"r[{string(field)}]"
        return (
            _source(bucket, start_ns, stop_ns, where)
            + _pipe(
                'pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")',
                f"filter(fn: (r) => {jobtags.FLUX_BUSY} and exists {value})",
                f"map(fn: (r) => ({{r with _value: {value}}}))",
            )
            + last
        )
    where = predicate([measurement], tags, fields=[field], workers=workers, job=job, busy=busy)
    return _source(bucket, start_ns, stop_ns, where) + last


def flux_dag_query(bucket, tags=None, start_ns=None, stop_ns=None) -> str:
    """The scheduler's ``dag`` points, fields pivoted into columns."""
    return _source(bucket, start_ns, stop_ns, predicate([schema.DAG], tags)) + _pipe(
        'pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")',
        f"keep(columns: {_array(['_time'] + DAG_COLUMNS[1:])})",
    )


def flux_points_query(bucket, measurement, columns, tags=None, start_ns=None, stop_ns=None) -> str:
    """Every point of ``measurement``, fields pivoted into columns, ``columns`` (tags or fields) kept."""
    return _source(bucket, start_ns, stop_ns, predicate([measurement], tags)) + _pipe(
        'pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")',
        f"keep(columns: {_array(['_time'] + list(columns))})",
        "group()",
    )


def flux_last_query(bucket, measurement, fields, by, tags=None, start_ns=None, stop_ns=None) -> str:
    """Each field's last value per distinct value of the tags ``by`` (a tag a series lacks: ""), pivoted: one
    row per group."""
    defaults = ", ".join(f'{t}: if exists r.{t} then r.{t} else ""' for t in by)
    return _source(bucket, start_ns, stop_ns, predicate([measurement], tags, fields=fields)) + _pipe(
        f"map(fn: (r) => ({{r with {defaults}}}))",
        f"group(columns: {_array([*by, '_field'])})",
        "last()",
        f"group(columns: {_array(by)})",
        f'pivot(rowKey: {_array(by)}, columnKey: ["_field"], valueColumn: "_value")',
        f"keep(columns: {_array([*by, *fields])})",
        "group()",
    )


BUCKETS_QUERY = 'buckets()\n    |> keep(columns: ["name"])\n'
