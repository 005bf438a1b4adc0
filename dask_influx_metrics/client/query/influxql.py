"""InfluxQL over HTTP ``/query``: InfluxDB 1.x, 2.x (through DBRP mappings) and 3.x.

Rows come back as CSV (``Accept: application/csv``, ``epoch=ns``), straight
into ``pandas.read_csv``; tags are selected as columns so no series headers
need parsing. Every question is filtered on the server (time range, worker,
job, extra tags) and asked one worker at a time, so nothing larger than one
worker's answer is ever held as text.

>>> where_clause({"run": "a'b"}, start_ns=1, stop_ns=None, worker="w", job=2)
'WHERE time >= 1 AND "run" = \\'a\\\\\\'b\\' AND "worker" = \\'w\\' AND "job" =~ /(^|,)2(,|$)/'
"""

from __future__ import annotations

import io
import logging
import re
from typing import Optional

import pandas as pd
import requests

from ... import credentials, jobtags, schema
from ...names import session_start_ns
from .base import (
    DEVICE_MEASUREMENTS,
    SAMPLE_MEASUREMENTS,
    SESSION_MEASUREMENTS,
    TAG_DTYPES,
    QueryError,
    ReadOptions,
    empty_frame,
    missing_database,
    widened,
)
from .sessions import SESSION, select_in_tags

logger = logging.getLogger(__name__)
INVENTORY_TAGS = ("worker", "job")  # what the first question groups by: workers, jobs, and (with them) fields
FIELD_SUFFIX = "_field"  # a name that may be a tag or a field: the field is selected as <name>_field
DAG_FIELD = "dag" + FIELD_SUFFIX  # the dag written as a field (dag-tag: false), selected beside the dag tag


def ident(name: str) -> str:
    """A double-quoted InfluxQL identifier."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def literal(value: str) -> str:
    """A single-quoted InfluxQL string literal."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def where_clause(
    tags: dict,
    start_ns: Optional[int],
    stop_ns: Optional[int],
    worker: Optional[str] = None,
    job: Optional[int] = None,
    busy: bool = False,
) -> str:
    terms = []
    if start_ns is not None:
        terms.append(f"time >= {int(start_ns)}")
    if stop_ns is not None:
        terms.append(f"time <= {int(stop_ns)}")
    terms += [f"{ident(k)} = {literal(v)}" for k, v in sorted(tags.items())]
    if worker is not None:
        terms.append(f'"worker" = {literal(worker)}')
    if job is not None:
        terms.append(f'"job" =~ {jobtags.influxql_regex(job)}')
    if busy:
        terms.append(jobtags.INFLUXQL_BUSY)
    return ("WHERE " + " AND ".join(terms)) if terms else ""


def parse_tags(text: str) -> dict:
    """The ``tags`` cell of a grouped CSV answer: ``dag=1,job=1\\,2`` -> ``{"dag": "1", "job": "1,2"}``.

    InfluxDB 3 leaves the comma in a value unescaped (``job=1,2``), so a pair
    starts only where a comma is followed by ``key=``.

    >>> parse_tags(r"dag=1,index=0,job=1\\,2") == parse_tags("dag=1,index=0,job=1,2")
    True
    >>> parse_tags("dag=1,2,job=1,2")
    {'dag': '1,2', 'job': '1,2'}
    """
    out = {}
    for pair in re.split(r"(?<!\\),(?=[^,=]*=)", text):
        key, _, value = pair.partition("=")  # our group keys (job, dag, index) hold no '='
        out[_unescape(key)] = _unescape(value)
    return out


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def tag_or_field(name: str) -> str:
    """Select ``name`` as a tag and as a field (InfluxDB 1.x casts; for a database that holds both):
    ``name`` and ``name_field`` columns, joined by :func:`_from_field`."""
    return f"{ident(name)}::tag AS {ident(name)}, {ident(name)}::field AS {ident(name + FIELD_SUFFIX)}"


def _from_field(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """Column ``name`` from the tag, or from ``name_field`` where the tag is empty."""
    if name + FIELD_SUFFIX not in frame.columns:
        return frame
    tag = frame[name].where(frame[name].notna() & (frame[name] != "")) if name in frame.columns else None
    field = frame[name + FIELD_SUFFIX]
    return frame.assign(**{name: (field if tag is None else tag.fillna(field)).astype(object)}).drop(
        columns=name + FIELD_SUFFIX
    )


def _dag_from_field(frame: pd.DataFrame, fields: list[str]) -> pd.DataFrame:
    """The ``dag`` column from the tag, or from the field where the tag is empty (``dag-tag: false``);
    rows that hold only the dag field (none of ``fields``) are dropped."""
    frame = _from_field(frame, "dag")
    present = [f for f in fields if f in frame.columns]
    return frame[frame[present].notna().any(axis=1)] if present else frame.iloc[:0]


class InfluxQLBackend:
    """Reads samples with InfluxQL; see :func:`dask_influx_metrics.query.connect`."""

    language = "influxql"

    def __init__(self, url: str, database: str, options: ReadOptions = ReadOptions(), page_rows: int = 10_000):
        url, username, password = credentials.take(url, options.username, options.password)  # into the header
        self.url, self.database, self.rp = url.rstrip("/"), database, options.retention_policy
        self.tags, self.start_ns, self.stop_ns = dict(options.tags or {}), options.start_ns, options.stop_ns
        self.timeout, self.page_rows = options.timeout, int(page_rows)
        self.undelivered = options.undelivered  # named when the database is missing
        self.session: Optional[str] = None  # the session read (sessions.select), None: any
        self._session = requests.Session()
        self._session.headers.update(credentials.auth_header(username, password, options.token))
        self.notes: list[str] = []
        self._inventory: Optional[list[dict]] = None
        try:
            self._check_database()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the HTTP connections (the ``requests.Session``)."""
        self._session.close()

    def describe(self) -> str:
        return (
            f"database {self.database!r}" + (f" (retention policy {self.rp!r})" if self.rp else "") + f" at {self.url}"
        )

    def widened(self):
        """The same source without time range or tags (to say what it holds)."""
        return widened(self, _inventory=None)

    # --- transport ---------------------------------------------------------
    def _get(self, q: str, csv: bool = True) -> requests.Response:
        params = {"db": self.database, "q": q, "epoch": "ns"}
        if self.rp:
            params["rp"] = self.rp
        headers = {"Accept": "application/csv"} if csv else {}
        try:
            r = self._session.get(self.url + "/query", params=params, headers=headers, timeout=self.timeout)
        except requests.RequestException as e:
            raise QueryError(f"cannot reach InfluxDB at {self.url}: {e}") from None
        if r.status_code >= 400:
            text = r.text.strip().replace("\n", " ")
            message = f"InfluxDB at {self.url} refused {q!r} (HTTP {r.status_code}): {text}"
            raise QueryError(missing_database(message, self.undelivered) if "database not found" in text else message)
        return r

    def _json(self, q: str) -> list[dict]:
        body = self._get(q, csv=False).json()
        out = []
        for result in body.get("results", []):
            if "error" in result:
                message = f"InfluxDB at {self.url}: {result['error']} in {q!r}"
                raise QueryError(
                    missing_database(message, self.undelivered) if "database not found" in message else message
                )
            out.extend(result.get("series", []))
        return out

    def _csv(self, q: str, dtype=None, keep_tags: bool = False) -> pd.DataFrame:
        text = self._get(q).content
        if not text.strip():
            return pd.DataFrame()
        if text.startswith(b"error"):
            raise QueryError(f"InfluxDB at {self.url}: {text.decode(errors='replace').strip()} in {q!r}")
        frame = pd.read_csv(io.BytesIO(text), dtype=dtype, keep_default_na=False, na_values=[""])
        drop = ("name",) if keep_tags else ("name", "tags")
        return frame.drop(columns=[c for c in drop if c in frame.columns])

    def _check_database(self) -> None:
        series = self._json("SHOW DATABASES")
        names = [row[0] for s in series for row in s.get("values", [])]
        if names and self.database not in names:
            raise QueryError(
                missing_database(
                    f"database {self.database!r} not found at {self.url}; databases: {sorted(names)}", self.undelivered
                )
            )

    def _where(self, **kw) -> str:
        return where_clause(self.tags, self.start_ns, self.stop_ns, **kw)

    # --- sessions (see .sessions) -------------------------------------------
    def select_session(self, session: str) -> None:
        """Read only ``session`` (a tag, or a field with ``session-tag: false``: ``WHERE`` reads either)."""
        select_in_tags(self, session)

    def session_rows(self, detail: bool = False) -> pd.DataFrame:
        """What sessions the points in range and tags (any session) belong to: ``session`` ("" for none) and
        ``first`` (ns) per measurement; with ``detail`` per ``host``, ``worker`` and ``job`` too, and ``last``.
        One ``LIMIT 1`` per series group and end; where ``session`` is a field (``session-tag: false``) its
        values are asked with ``DISTINCT`` (every point read) and each session's groups one by one."""
        tags = {k: v for k, v in self.tags.items() if k != SESSION}
        where = where_clause(tags, self.start_ns, self.stop_ns)
        rows = self._edges(where, (SESSION, "host", "worker", "job") if detail else (SESSION,), detail)
        if rows.empty or not rows["field"].notna().any():
            return rows.drop(columns="field")
        names = ", ".join(ident(m) for m in SESSION_MEASUREMENTS)
        answer = self._json(f"SELECT DISTINCT({ident(SESSION)}) FROM {names} {where}")
        values = sorted({row[1] for x in answer for row in x.get("values", [])} - {None, ""})
        if not detail:
            return pd.DataFrame({"session": values, "first": [session_start_ns(v) or 0 for v in values]})
        parts = []
        for value in values:
            mine = where_clause({**tags, SESSION: value}, self.start_ns, self.stop_ns)
            parts.append(self._edges(mine, ("host", "worker", "job"), True).assign(session=value))
        return pd.concat(parts, ignore_index=True).drop(columns="field") if parts else rows.iloc[:0]

    def _edges(self, where: str, keys: tuple, last: bool) -> pd.DataFrame:
        """The first (and ``last``) point's time of each series group ``keys`` of the session measurements;
        ``field``: the ``session`` field of the first point, where there is one."""
        names = ", ".join(ident(m) for m in SESSION_MEASUREMENTS)
        group = ", ".join(ident(k) for k in keys)
        found: dict[tuple, dict] = {}
        for order, column in (("ASC", "first"), ("DESC", "last"))[: 2 if last else 1]:
            for s in self._json(f"SELECT * FROM {names} {where} GROUP BY {group} ORDER BY time {order} LIMIT 1"):
                if not s.get("values"):
                    continue
                tags = {k: s.get("tags", {}).get(k) or "" for k in keys}
                row = found.setdefault((s["name"], *tags.values()), {"measurement": s["name"], **tags, "field": None})
                row[column] = int(s["values"][0][0])
                if column == "first" and SESSION in s["columns"]:
                    row["field"] = s["values"][0][s["columns"].index(SESSION)]
        columns = ["measurement", *keys, "first", *(["last"] if last else []), "field"]
        return pd.DataFrame(list(found.values()), columns=columns)

    # --- what exists -------------------------------------------------------
    def fields(self) -> dict[str, list[str]]:
        """``{measurement: [field keys]}`` of the sample measurements, as far as they hold values
        within the time range and tags (``SHOW FIELD KEYS`` would answer for the whole database,
        every session ever written)."""
        out: dict[str, set] = {}
        for s in self._firsts():
            out.setdefault(s["name"], set()).update(
                c[len("first_") :]
                for c, v in zip(s["columns"], s["values"][0])
                if c.startswith("first_") and v is not None
            )
        return {m: sorted(f - set(schema.COMMON_TAGS)) for m, f in out.items() if f - set(schema.COMMON_TAGS)}

    def tag_values(self, key: str) -> list[str]:
        """Distinct values of tag ``key`` on sample points (within the time range and tags).

        Asked of the data itself, exact for the time range (``SHOW TAG VALUES``
        answers from the series index, for all time).
        """
        series = self._firsts() if key in INVENTORY_TAGS else self._firsts((key,))
        return sorted({s.get("tags", {}).get(key) for s in series} - {None, ""})

    def dag_is_field(self) -> bool:
        """Whether samples in range carry ``dag`` as a field (``dag-tag: false``), from the inventory."""
        return any(
            c == "first_dag" and v is not None for s in self._firsts() for c, v in zip(s["columns"], s["values"][0])
        )

    def _firsts(self, keys: tuple = INVENTORY_TAGS) -> list[dict]:
        """``first(*)`` of each sample measurement per value of tags ``keys``: the series that hold a
        value in range. ``first`` reads one point per series where ``count`` would read them all; the
        answer for workers and jobs (fields come with it) is asked once and kept."""
        if keys == INVENTORY_TAGS and self._inventory is not None:
            return self._inventory
        names = ", ".join(ident(m) for m in SAMPLE_MEASUREMENTS)
        series = self._json(f"SELECT first(*) FROM {names} {self._where()} GROUP BY {', '.join(map(ident, keys))}")
        series = [s for s in series if s.get("values") and any(v is not None for v in s["values"][0][1:])]
        if keys == INVENTORY_TAGS:
            self._inventory = series
        return series

    def first_time(self) -> Optional[int]:
        """Time (ns) of the first sample in range, or None when there is none."""
        return self._edge("ASC")

    def last_time(self) -> Optional[int]:
        """Time (ns) of the last sample in range, or None when there is none."""
        return self._edge("DESC")

    def _edge(self, order: str) -> Optional[int]:
        times = []
        for m in SAMPLE_MEASUREMENTS:
            frame = self._csv(f"SELECT * FROM {ident(m)} {self._where()} ORDER BY time {order} LIMIT 1")
            if not frame.empty:
                times.append(int(frame["time"].iloc[0]))
        return (min if order == "ASC" else max)(times) if times else None

    # --- samples -----------------------------------------------------------
    def frame(
        self,
        measurement: str,
        fields: list[str],
        worker: Optional[str],
        job: Optional[int] = None,
        host: Optional[str] = None,
    ) -> pd.DataFrame:
        """Long samples of one worker: ``time``, ``job``, ``dag``, [``index``], fields; with ``host``
        (and ``worker=None``) every point of that host, with a ``worker`` column (the host series).

        Asked as ``GROUP BY job, dag, index`` (half the server time of selecting
        tags as columns), then checked against the server's ``count()`` of each
        field: a response cut short by a server's ``max-row-limit`` is read
        again in time-ordered pages, never returned short. Where ``dag`` is a
        field (``dag-tag: false``) it is selected too and fills in where the tag is empty.
        """
        groups = (
            ["job", "dag"] + (["index"] if measurement in DEVICE_MEASUREMENTS else []) + (["worker"] if host else [])
        )
        where = where_clause(
            {**self.tags, **({"host": host} if host else {})}, self.start_ns, self.stop_ns, worker=worker, job=job
        )
        select = ", ".join(ident(f) for f in fields) + (f', "dag" AS {ident(DAG_FIELD)}' if self.dag_is_field() else "")
        frame = self._csv(
            f"SELECT {select} FROM {ident(measurement)} {where} GROUP BY " + ", ".join(ident(g) for g in groups),
            dtype={"running": str, DAG_FIELD: str},
            keep_tags=True,
        )
        if frame.empty:
            return empty_frame(fields, "index" in groups)
        # a point without any of the group tags (another tool's) has an empty cell: no tags
        tags = pd.DataFrame(
            [parse_tags(t) if isinstance(t, str) else {} for t in frame["tags"].unique()], index=frame["tags"].unique()
        )
        for g in groups:
            frame[g] = frame["tags"].map(tags[g] if g in tags.columns else {}).astype(object)
        frame = _dag_from_field(frame.drop(columns="tags"), fields)
        frame = frame.sort_values("time", kind="stable").reset_index(drop=True)
        counts = self._csv(
            f"SELECT {', '.join(f'count({ident(f)})' for f in fields)} FROM {ident(measurement)} {where}"
        )
        got = [int(frame[f].notna().sum()) if f in frame.columns else 0 for f in fields]
        # a field without values in the range counts as an empty cell (NaN), i.e. 0
        if (
            not counts.empty
            and pd.to_numeric(counts.iloc[0, 1 : 1 + len(fields)]).fillna(0).astype(int).tolist() != got
        ):
            frame = self._paged(measurement, fields, groups, where)
        if "index" in frame.columns:  # per-worker custom metrics have no index: null, not ""
            frame["index"] = frame["index"].replace("", None)
            if frame["index"].isna().all():
                frame, groups = frame.drop(columns="index"), [g for g in groups if g != "index"]
        return frame[["time"] + groups + [f for f in fields if f in frame.columns]]

    def _paged(self, measurement: str, fields: list[str], groups: list[str], where: str) -> pd.DataFrame:
        """The same rows in pages of ``page_rows``, ordered by time (for servers with a row limit)."""
        select = ", ".join(ident(c) for c in list(fields) + groups)  # "dag": the field where there is one
        pages, since = [], None
        while True:
            clause = where + (f"{' AND' if where else 'WHERE'} time >= {since}" if since is not None else "")
            q = f"SELECT {select} FROM {ident(measurement)} {clause} ORDER BY time ASC LIMIT {self.page_rows}"
            page = self._csv(q, dtype={**TAG_DTYPES, "running": str})
            if len(page) < self.page_rows:
                pages.append(page)
                break
            last = int(page["time"].iloc[-1])
            if int(page["time"].iloc[0]) == last:
                raise QueryError(f"more than page_rows={self.page_rows} rows share time {last}; raise page_rows")
            pages.append(page[page["time"] < last])  # the last instant is read again, whole
            since = last
        return _dag_from_field(pd.concat(pages, ignore_index=True), fields)

    def max_by(self, measurement: str, field: str, by: tuple, workers=None, job=None, busy=False) -> pd.DataFrame:
        """Server-side ``MAX(field) GROUP BY by``: one row per group, columns ``by`` + ``max``.

        ``busy`` keeps busy samples only (``dag != '0'``).
        """
        rows = []
        for worker in workers if workers is not None else [None]:
            group = ", ".join(ident(t) for t in by)
            q = (
                f"SELECT max({ident(field)}) FROM {ident(measurement)} "
                f"{self._where(worker=worker, job=job, busy=busy)} GROUP BY {group}"
            )
            for s in self._json(q):
                tags = s.get("tags", {})
                for row in s.get("values", []):
                    if row[1] is not None:
                        rows.append({**{t: tags.get(t, "") for t in by}, "max": row[1]})
        return pd.DataFrame(rows, columns=list(by) + ["max"])

    def dag_points(self) -> pd.DataFrame:
        """The scheduler's ``dag`` points: time, job, dag, status, event, tasks, label, duration."""
        where = where_clause({k: v for k, v in self.tags.items()}, self.start_ns, self.stop_ns)
        dtype = {
            **TAG_DTYPES,
            "status": str,
            "event": str,
            "label": str,
            DAG_FIELD: str,
            "status" + FIELD_SUFFIX: str,
            SESSION: str,
        }
        frame = self._csv(
            f'SELECT "event", "tasks", "label", "duration", "job", "dag", "status", "session" FROM "dag" {where}',
            dtype=dtype,
        )
        if "dag" in frame.columns and frame["dag"].isna().any():
            # dag and status are fields, tags in points written before they were: where one shard holds
            # both, "dag" names the field. Ask for both (InfluxDB 1.x casts).
            q = (
                f'SELECT "event", "tasks", "label", "duration", "job", {tag_or_field("dag")}, '
                f'{tag_or_field("status")}, "session" FROM "dag" {where}'
            )
            frame = _from_field(_from_field(self._csv(q, dtype=dtype), "dag"), "status")
        return frame

    def points(self, measurement: str, columns: list[str]) -> pd.DataFrame:
        """Every point of ``measurement`` in range: ``time`` and ``columns`` (tags or fields alike)."""
        select = ", ".join(ident(c) for c in columns)
        frame = self._csv(
            f"SELECT {select} FROM {ident(measurement)} {self._where()}",
            dtype={c: str for c in columns if c in schema.MEASUREMENT_TAGS.get(measurement, ())},
        )
        return frame.reindex(columns=["time"] + list(columns))

    def last_by(self, measurement: str, fields: list[str], by: tuple) -> pd.DataFrame:
        """Server-side ``last(field)`` of each field ``GROUP BY by``: one row per group, columns ``by`` + fields
        (a tag a series lacks: "")."""
        select = ", ".join(f"last({ident(f)}) AS {ident(f)}" for f in fields)
        q = f"SELECT {select} FROM {ident(measurement)} {self._where()} GROUP BY {', '.join(map(ident, by))}"
        rows = []
        for s in self._json(q):
            tags = s.get("tags", {})
            for row in s.get("values", []):
                values = dict(zip(s["columns"], row))
                rows.append({**{t: tags.get(t, "") for t in by}, **{f: values.get(f) for f in fields}})
        return pd.DataFrame(rows, columns=list(by) + list(fields))
