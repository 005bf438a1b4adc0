"""Flux over ``/api/v2/query``: InfluxDB 2.x, and 1.8+ with Flux enabled.

On 1.8 the bucket is ``database/retention-policy`` and the token
``user:password`` (or nothing without auth). Needs ``influxdb-client``
(``pip install dask-influx-metrics[flux]``). Each question is one Flux script,
built by a pure ``flux_*_query`` function and filtered on the server (time
range, worker, job, extra tags); answers come back as annotated CSV, read
column-wise (:mod:`.fluxcsv`) so times keep their nanoseconds and tag values stay strings.
The scripts come from :mod:`.fluxtext`.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from ... import credentials, schema
from .base import (
    DEVICE_MEASUREMENTS,
    SAMPLE_MEASUREMENTS,
    QueryError,
    ReadOptions,
    empty_frame,
    missing_database,
    widened,
)
from .fluxcsv import read_annotated_csv
from .fluxtext import (
    BUCKETS_QUERY,
    DAG_COLUMNS,
    flux_dag_query,
    flux_fields_query,
    flux_first_time_query,
    flux_frame_query,
    flux_last_query,
    flux_last_time_query,
    flux_max_query,
    flux_points_query,
    flux_session_query,
    flux_tag_values_query,
)
from .sessions import SESSION, select_in_tags


def _iso(ns: int) -> str:
    return pd.Timestamp(int(ns), unit="ns", tz="UTC").isoformat().replace("+00:00", "Z")


# --- the backend ---------------------------------------------------------------
class FluxBackend:
    """Reads samples with Flux; see :func:`dask_influx_metrics.query.connect`."""

    language = "flux"

    def __init__(self, url: str, bucket: str, options: ReadOptions = ReadOptions()):
        try:
            import influxdb_client
            import urllib3
            from influxdb_client.rest import ApiException
        except ImportError:
            raise ImportError("the Flux backend needs influxdb-client: pip install dask-influx-metrics[flux]") from None
        url, username, password = credentials.take(url, options.username, options.password)  # into the token
        token = options.token or (f"{username}:{password or ''}" if username else None)
        self.url, self.bucket, self.org = url.rstrip("/"), bucket, options.org
        self.tags, self.start_ns, self.stop_ns = dict(options.tags or {}), options.start_ns, options.stop_ns
        self.notes: list[str] = []
        self.undelivered = options.undelivered  # named when the bucket is missing
        self.session: Optional[str] = None  # the session read (sessions.select), None: any
        self._asked = (self.start_ns, self.stop_ns)  # the range asked for (a session's may narrow it)
        self._dag_field: Optional[bool] = None  # whether samples carry dag as a field (dag-tag: false)
        self._client = influxdb_client.InfluxDBClient(
            url=self.url, token=token, org=self.org, timeout=int(options.timeout * 1000)
        )
        self._api = self._client.query_api()
        self._dialect = influxdb_client.Dialect(
            header=True,
            delimiter=",",
            comment_prefix="#",
            annotations=["datatype", "group", "default"],
            date_time_format="RFC3339Nano",
        )
        self._api_error, self._net_errors = ApiException, (urllib3.exceptions.HTTPError, OSError)
        try:
            self._check_bucket()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the ``InfluxDBClient`` and its connections."""
        self._client.close()

    def describe(self) -> str:
        return f"bucket {self.bucket!r} at {self.url}"

    def widened(self):
        """The same source without time range or tags (to say what it holds)."""
        return widened(self, _asked=(None, None))

    # --- transport ---------------------------------------------------------
    def _query(self, query: str) -> pd.DataFrame:
        try:
            response = self._api.query_raw(query, org=self.org, dialect=self._dialect)
            try:
                text = response.data.decode("utf-8")
            finally:
                response.release_conn()
        except self._api_error as e:
            message = e.message if getattr(e, "response", None) is not None else e.reason
            if isinstance(message, bytes):
                message = message.decode(errors="replace").strip()
            if e.status == 404 and str(message).startswith("404 page not found"):
                raise QueryError(
                    f"InfluxDB at {self.url} does not answer Flux (/api/v2/query: 404 page not found): "
                    "InfluxDB 1.x answers Flux from 1.8 on, with flux-enabled = true in its [http] "
                    "section; or ask with InfluxQL (language='influxql', --language influxql)"
                ) from None
            raise QueryError(
                f"InfluxDB at {self.url} refused the Flux query (HTTP {e.status}): {message}\n{query}"
            ) from None
        except self._net_errors as e:
            raise QueryError(f"cannot reach InfluxDB at {self.url}: {e}") from None
        return read_annotated_csv(text, query)

    def _check_bucket(self) -> None:
        names = self._query(BUCKETS_QUERY)
        names = sorted(names["name"].dropna()) if "name" in names else []
        # on 1.8 buckets are "db/rp" and "db" alone means the default retention policy
        if names and self.bucket not in names and not any(n.startswith(self.bucket + "/") for n in names):
            raise QueryError(
                missing_database(f"bucket {self.bucket!r} not found at {self.url}; buckets: {names}", self.undelivered)
            )

    def _window(self) -> dict:
        return {"tags": self.tags, "start_ns": self.start_ns, "stop_ns": self.stop_ns}

    # --- sessions (see .sessions) -------------------------------------------
    def session_rows(self, detail: bool = False, only: Optional[str] = None) -> pd.DataFrame:
        """What sessions the points in range and tags (any session; ``only``: that one) belong to:
        ``session`` ("" for none) and ``first`` (ns); with ``detail`` per ``host``, ``worker`` and ``job``
        too, and ``last``. Where ``session`` is a field (``session-tag: false``), from its values."""
        tags = {k: v for k, v in self.tags.items() if k != SESSION}
        rows = self._session_rows(detail, False, {**tags, **({SESSION: only} if only else {})})
        if rows.empty or rows["session"].ne("").all():
            return rows
        by_field = self._session_rows(detail, True, tags)  # the points without a session tag: a field?
        if only:
            by_field = by_field[by_field["session"] == only]
        return by_field if not by_field.empty else rows

    def _session_rows(self, detail: bool, field: bool, tags: dict) -> pd.DataFrame:
        keys = [SESSION, "host", "worker", "job"] if detail else [SESSION]
        start, stop = self._asked  # not a session's range (session-tag: false)
        window = {"tags": tags, "start_ns": start, "stop_ns": stop}
        frames = []
        for last in (False, True)[: 2 if detail else 1]:
            data = self._query(flux_session_query(self.bucket, keys, last=last, field=field, **window))
            if data.empty or "_time" not in data.columns:
                return pd.DataFrame(columns=keys + ["first"] + (["last"] if detail else []))
            data = data.rename(columns={"_time": "last" if last else "first", **({"_value": SESSION} if field else {})})
            data = data.reindex(columns=keys + ["last" if last else "first"])
            frames.append(data.assign(**{k: data[k].astype(object).where(data[k].notna(), "") for k in keys}))
        if not detail:
            return frames[0]
        return frames[0].merge(frames[1], on=keys, how="outer")

    def select_session(self, session: str) -> None:
        """Read only ``session``: a tag filter, or where it is a field (``session-tag: false``) its time range."""
        if session and self.session_rows(only=session).empty:  # not a tag: a field?
            span = self._session_rows(True, True, {k: v for k, v in self.tags.items() if k != SESSION})
            span = span[span["session"] == session]
            if not span.empty:
                first, last = int(span["first"].min()), int(span["last"].max())
                self.start_ns = max(first, self.start_ns or first)
                self.stop_ns = min(last, self.stop_ns if self.stop_ns is not None else last)
                self.session = session
                self.notes.append(
                    f"session {session!r} is a field here (session-tag: false): Flux reads it by its time range, "
                    f"{_iso(first)} to {_iso(last)}; what another session wrote within it is read too"
                )
                return
        select_in_tags(self, session)

    # --- what exists -------------------------------------------------------
    def fields(self) -> dict[str, list[str]]:
        """``{measurement: [field keys]}`` for the sample measurements (within range and tags)."""
        data = self._query(flux_fields_query(self.bucket, **self._window()))
        if data.empty:
            return {}
        data = data.dropna()
        self._dag_field = bool((data["field"] == "dag").any())
        data = data[~data["field"].isin(schema.COMMON_TAGS)]
        return {
            m: sorted(set(data.loc[data["measurement"] == m, "field"]))
            for m in SAMPLE_MEASUREMENTS
            if (data["measurement"] == m).any()
        }

    def dag_is_field(self) -> bool:
        """Whether the samples in range carry ``dag`` as a field (``dag-tag: false``), asked once."""
        if self._dag_field is None:
            self._dag_field = False
            self.fields()
        return self._dag_field

    def tag_values(self, key: str) -> list[str]:
        """Distinct values of tag ``key`` on sample points (within the time range and tags)."""
        data = self._query(flux_tag_values_query(self.bucket, key, **self._window()))
        if data.empty or "_value" not in data:
            return []
        return sorted({v for v in data["_value"].dropna() if v != ""})

    def first_time(self) -> Optional[int]:
        """Time (ns) of the first sample in range, or None when there is none."""
        data = self._query(flux_first_time_query(self.bucket, **self._window()))
        return None if data.empty else int(data["_time"].min())

    def last_time(self) -> Optional[int]:
        """Time (ns) of the last sample in range, or None when there is none."""
        data = self._query(flux_last_time_query(self.bucket, **self._window()))
        return None if data.empty else int(data["_time"].max())

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
        (and ``worker=None``) every point of that host, with a ``worker`` column."""
        device = measurement in DEVICE_MEASUREMENTS
        data = self._frame(measurement, fields, worker, job, bool(self._dag_field), host)
        if not self._dag_field and not data.empty:  # no dag tag in the answer: dag is a field (dag-tag: false)
            self._dag_field = "dag" not in data.columns or data["dag"].isna().all()
            if self._dag_field:
                data = self._frame(measurement, fields, worker, job, True, host)
        if data.empty:
            return empty_frame(fields, device).assign(**({"worker": []} if host else {}))
        keep_index = device and "index" in data.columns and data["index"].notna().any()
        cols = ["time", "job", "dag"] + (["index"] if keep_index else []) + (["worker"] if host else []) + list(fields)
        data = data.rename(columns={"_time": "time"}).reindex(columns=cols)
        if fields:
            data = data[data[list(fields)].notna().any(axis=1)]  # rows that held only the dag field
        return data.sort_values("time", kind="stable").reset_index(drop=True)

    def _frame(self, measurement, fields, worker, job, dag_field: bool, host=None) -> pd.DataFrame:
        return self._query(
            flux_frame_query(
                self.bucket, measurement, fields, worker, job, **self._window(), dag_field=dag_field, host=host
            )
        )

    def max_by(self, measurement: str, field: str, by: tuple, workers=None, job=None, busy=False) -> pd.DataFrame:
        """Server-side ``group(columns: by) |> max()``: one row per group, columns ``by`` + ``max``.

        ``busy`` keeps busy samples only (``dag != "0"``).
        """
        by = list(by)
        empty = pd.DataFrame(columns=by + ["max"])
        if workers is not None and not list(workers):
            return empty
        query = flux_max_query(
            self.bucket,
            measurement,
            field,
            by,
            None if workers is None else list(workers),
            job,
            **self._window(),
            busy=busy,
            dag_field=busy and self.dag_is_field(),
        )
        data = self._query(query)
        if data.empty or "_value" not in data:
            return empty
        data = data.rename(columns={"_value": "max"}).dropna(subset=["max"])
        for t in by:  # a tag some series lack groups as "" (as InfluxQL's GROUP BY does)
            data[t] = data[t].astype(object).fillna("").astype(str) if t in data.columns else ""
        return data[by + ["max"]].sort_values(by, kind="stable").reset_index(drop=True)

    def dag_points(self) -> pd.DataFrame:
        """The scheduler's ``dag`` points: time, job, dag, status, event, tasks, label, duration."""
        data = self._query(flux_dag_query(self.bucket, **self._window()))
        if data.empty:
            return pd.DataFrame(columns=DAG_COLUMNS)
        data = data.rename(columns={"_time": "time"})
        return data.reindex(columns=DAG_COLUMNS).sort_values("time", kind="stable").reset_index(drop=True)

    def points(self, measurement: str, columns: list[str]) -> pd.DataFrame:
        """Every point of ``measurement`` in range: ``time`` and ``columns`` (tags or fields alike)."""
        data = self._query(flux_points_query(self.bucket, measurement, columns, **self._window()))
        data = data.rename(columns={"_time": "time"}).reindex(columns=["time"] + list(columns))
        return data.sort_values("time", kind="stable").reset_index(drop=True)

    def last_by(self, measurement: str, fields: list[str], by: tuple) -> pd.DataFrame:
        """Each field's last value per distinct value of the tags ``by`` (a tag a series lacks: "")."""
        data = self._query(flux_last_query(self.bucket, measurement, list(fields), list(by), **self._window()))
        data = data.reindex(columns=list(by) + list(fields))
        for t in by:
            data[t] = data[t].astype(object).fillna("").astype(str)
        return data.reset_index(drop=True)
