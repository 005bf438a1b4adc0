"""The local spool as a query backend: same questions, same answers as InfluxDB.

A spool root holds one folder per monitoring session
(``<root>/<session>/<worker>/spool-*.lp``, the scheduler's ``dag`` points
under ``<root>/<session>/scheduler/``). Point ``connect`` at the root (the
latest session is read, or the one ``session=`` names: see :mod:`.sessions`)
or at one session's folder. Each worker's files are parsed only when that
worker is asked about, then kept.

A line that does not parse is skipped, counted and named (``file:line``) in
:attr:`SpoolBackend.notes` and a log warning; an unterminated last line (a
write torn by a crash) is ignored silently. Samples an HTTP sink could not
deliver (``<worker>/undelivered/``) or InfluxDB refused (``<worker>/refused/``)
are read with the rest and counted in the notes; ``refused/`` only where the
worker had no spool sink (else its spool files hold those lines already).
"""

from __future__ import annotations

import logging
import os
from typing import Iterator, Optional

import pandas as pd

from ... import jobtags, lineparse, schema
from ...lineparse import split_lines
from ...names import session_start_ns
from ...sinks.paths import REFUSED_DIR, UNDELIVERED_DIR
from ...sinks.spool import spool_files
from .base import DEVICE_MEASUREMENTS, SAMPLE_MEASUREMENTS, TAG_DTYPES, QueryError, ReadOptions, empty_frame, widened
from .sessions import SESSION

logger = logging.getLogger(__name__)
WORKER_MEASUREMENTS = (*SAMPLE_MEASUREMENTS, schema.DISK, schema.TASK, schema.ACTIVITY)  # what a worker's points are

SCHEDULER_DIR = "scheduler"


def sessions(root) -> list[str]:
    """Session folder names under a spool root, oldest first (names sort by start time).

    >>> sessions("/nonexistent")
    []
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        return []
    return sorted(
        d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and _is_session(os.path.join(root, d))
    )


def _is_session(path: str) -> bool:
    """Whether ``path`` is one session's folder: ``<sender>/spool-*.lp`` or, from an HTTP sink alone,
    ``<sender>/undelivered/spool-*.lp`` (an outage) or ``<sender>/refused/spool-*.lp``."""
    return any(
        f.endswith(".lp") and os.path.isfile(os.path.join(folder, f))
        for d in os.listdir(path)
        if os.path.isdir(os.path.join(path, d))
        for folder in (os.path.join(path, d, sub) for sub in ("", UNDELIVERED_DIR, REFUSED_DIR))
        if os.path.isdir(folder)
        for f in os.listdir(folder)
    )


def _records(path: str) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of each complete line of one spool file; a torn last line is left out.

    A record that runs on over several lines (an unclosed quote) and does not
    parse is tried line by line, so one bad quote cannot swallow the rest.
    """
    with open(path, "rb") as f:
        data = f.read()
    records, rest = split_lines(data)
    if b"\n" in rest:  # an open quote ran on to the end: complete lines, then the unterminated one
        records.append(rest.rsplit(b"\n", 1)[0])
    pos = newlines = 0  # newlines before pos
    for record in records:
        start = data.find(record, pos)
        newlines += data.count(b"\n", pos, start)
        if b"\n" in record and not _parses(record):
            yield from ((newlines + 1 + k, part) for k, part in enumerate(record.split(b"\n")) if part.strip())
        else:
            yield newlines + 1, record
        newlines += record.count(b"\n")
        pos = start + len(record)


def _parses(line: bytes) -> bool:
    try:
        lineparse.parse(line)
    except ValueError:
        return False
    return True


def read_points(folder: str) -> tuple[list, list[str], dict[str, int]]:
    """Points of every spool file under ``folder``; the lines skipped as ``"file:line: why"``;
    how many points came from its ``undelivered/`` and ``refused/`` folders (``{name: count}``)."""
    points, skipped, kept = [], [], {UNDELIVERED_DIR: 0, REFUSED_DIR: 0}
    files = spool_files(folder)
    spooled = any(os.path.dirname(path) == os.path.normpath(folder) for path in files)  # a spool sink wrote here
    for path in files:
        where = os.path.relpath(path, folder).split(os.sep)[0]
        if where == REFUSED_DIR and spooled:
            continue  # the spool sink's own files hold these lines
        for line, record in _records(path):
            try:
                points.append(lineparse.parse(record))
            except ValueError as e:
                skipped.append(f"{path}:{line}: {e}")
                continue
            if where in kept:
                kept[where] += 1
    if skipped:
        logger.warning("spool: skipped %d corrupt line(s) under %s: %s", len(skipped), folder, _first(skipped))
    return points, skipped, kept


def _first(items: list[str], n: int = 3) -> str:
    return "; ".join(items[:n]) + (f"; ... {len(items) - n} more" if len(items) > n else "")


def _long(points: list, measurement: str) -> pd.DataFrame:
    rows = [{"time": p.time_ns, **p.tags, **p.fields} for p in points if p.measurement == measurement]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.astype({k: str for k in TAG_DTYPES if k in frame.columns})


class SpoolBackend:
    """Reads a spool folder; see :func:`dask_influx_metrics.query.connect`."""

    language = "spool"

    def __init__(self, path, options: ReadOptions = ReadOptions()):
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise QueryError(f"spool folder {path!r} does not exist")
        # a session's folder, or a root of them (every session until select_session: .sessions decides)
        self.root, found = (
            (None, [path]) if _is_session(path) else (path, [os.path.join(path, s) for s in sessions(path)])
        )
        if not found:
            raise QueryError(f"no spooled samples under {path!r} (expected <session>/<worker>/spool-*.lp)")
        self.tags, self.start_ns, self.stop_ns = dict(options.tags or {}), options.start_ns, options.stop_ns
        self._cache: dict[str, dict[str, pd.DataFrame]] = {}
        self._workers: dict[str, dict[str, pd.DataFrame]] | None = None  # worker -> measurement -> its points
        self.skipped: dict[str, list[str]] = {}  # folder -> "file:line: why" of each corrupt line
        self.undelivered: dict[str, dict] = {}  # folder -> points read from its undelivered/ and refused/
        self._read(found)

    def _read(self, folders: list[str]) -> None:
        """Read the sessions in ``folders``: one folder per sampling process in each, a host's agent (every
        worker of the host), a worker's own (custom metrics, the task stream), or a worker of versions before
        the agent; the scheduler's ``dag`` points apart."""
        self.folders = folders
        self.path = folders[0] if len(folders) == 1 else self.root
        self.session = os.path.basename(folders[0]) if len(folders) == 1 else None  # None: every session
        self._paths = [
            os.path.join(f, n)
            for f in folders
            for n in sorted(os.listdir(f))
            if n != SCHEDULER_DIR and os.path.isdir(os.path.join(f, n))
        ]

    def close(self) -> None:
        """Nothing to release: files are read whole and closed."""

    def describe(self) -> str:
        if len(self.folders) == 1:
            return f"spool session {os.path.basename(self.folders[0])!r} ({self.folders[0]})"
        return f"spool root {self.root!r}"

    def widened(self) -> "SpoolBackend":
        """The same session without time range or tags (to say what it holds)."""
        return widened(self, _cache={}, _workers=None, skipped={}, undelivered={})

    # --- sessions (see .sessions) -------------------------------------------
    def session_rows(self, detail: bool = False) -> pd.DataFrame:
        """The sessions here (one folder each) with points in range and tags: ``session`` and ``first`` (ns);
        with ``detail`` per ``host``, ``worker`` and ``job`` too, and ``last``. Files are read only for the
        details, a range, tags, or a folder whose name is no session id (then what its name says is ``first``)."""
        folders = [os.path.join(self.root, s) for s in sessions(self.root)] if self.root else self.folders[:1]
        narrowed = self.tags or self.start_ns is not None or self.stop_ns is not None
        rows = []
        for folder in folders:
            sid = os.path.basename(folder)
            if not detail and not narrowed and session_start_ns(sid) is not None:
                rows.append({SESSION: sid, "first": session_start_ns(sid)})
                continue
            one = widened(self, _cache={}, _workers=None, skipped={}, undelivered={})
            one._read([folder])
            one.tags, one.start_ns, one.stop_ns = self.tags, self.start_ns, self.stop_ns
            frames = [f for w in one._worker_frames() for f in w.values() if not f.empty]
            frames += [f for f in [one.dag_points()] if not f.empty]
            for f in frames:
                keys = [k for k in ("host", "worker", "job") if k in f.columns]
                for key, group in f.groupby(keys, dropna=False) if keys else [((), f)]:
                    key = key if isinstance(key, tuple) else (key,)
                    rows.append(
                        {
                            SESSION: sid,
                            **dict(zip(keys, key)),
                            "first": group["time"].min(),
                            "last": group["time"].max(),
                        }
                    )
        columns = [SESSION, "host", "worker", "job", "first", "last"] if detail else [SESSION, "first"]
        return pd.DataFrame(rows).reindex(columns=columns)

    def select_session(self, session: str) -> None:
        """Read only ``session``'s folder."""
        found = {
            os.path.basename(f): f
            for f in ([os.path.join(self.root, s) for s in sessions(self.root)] if self.root else self.folders)
        }
        if session not in found:
            where = self.root or os.path.dirname(self.folders[0])
            raise QueryError(f"session {session!r} not in {where!r}; sessions: {sorted(found)}")
        self._read([found[session]])

    @property
    def notes(self) -> list[str]:
        """One line per thing the answers should be read with: corrupt lines skipped, undelivered samples read."""
        skipped = [s for lines in self.skipped.values() for s in lines]
        out = [f"skipped {len(skipped)} corrupt spool line(s): {_first(skipped)}"] if skipped else []
        undelivered = sum(kept[UNDELIVERED_DIR] for kept in self.undelivered.values())
        if undelivered:
            out.append(f"{undelivered} sample(s) came from {UNDELIVERED_DIR}/ (not delivered over HTTP at the time)")
        refused = sum(kept[REFUSED_DIR] for kept in self.undelivered.values())
        if refused:
            out.append(
                f"{refused} sample(s) came from {REFUSED_DIR}/ (InfluxDB refused them; its reasons are in "
                f"{REFUSED_DIR}/reasons.txt)"
            )
        return out

    def _filter(self, frame: pd.DataFrame) -> pd.DataFrame:
        if frame.empty:
            return frame
        keep = pd.Series(True, index=frame.index)
        if self.start_ns is not None:
            keep &= frame["time"] >= self.start_ns
        if self.stop_ns is not None:
            keep &= frame["time"] <= self.stop_ns
        for k, v in self.tags.items():
            keep &= (frame[k] == v) if k in frame.columns else False
        return frame[keep]

    def _frames(self, folder: str) -> dict[str, pd.DataFrame]:
        if folder not in self._cache:
            points, self.skipped[folder], self.undelivered[folder] = read_points(folder)
            measurements = {p.measurement for p in points}
            self._cache[folder] = {m: self._filter(_long(points, m)) for m in measurements}
        return self._cache[folder]

    @property
    def _folders(self) -> dict[str, dict[str, pd.DataFrame]]:
        """Worker address -> measurement -> that worker's points, from every folder of the session."""
        if self._workers is None:
            parts: dict[str, dict[str, list]] = {}
            for folder in self._paths:
                for m, frame in self._frames(folder).items():
                    if m not in WORKER_MEASUREMENTS or "worker" not in frame.columns:  # not delivery counters
                        continue
                    for worker, rows in frame.groupby("worker", sort=False):
                        parts.setdefault(worker, {}).setdefault(m, []).append(rows)
            self._workers = {
                w: {
                    m: pd.concat(f, ignore_index=True) if len(f) > 1 else f[0].reset_index(drop=True)
                    for m, f in ms.items()
                }
                for w, ms in sorted(parts.items())
            }
        return self._workers

    def _worker_frames(self):
        yield from self._folders.values()

    # --- what exists -------------------------------------------------------
    def fields(self) -> dict[str, list[str]]:
        out: dict[str, set] = {}
        skip = {"time", *schema.COMMON_TAGS, *schema.DEVICE_TAGS, *self.tags}
        for frames in self._worker_frames():
            for m, frame in frames.items():
                if m in SAMPLE_MEASUREMENTS and not frame.empty:
                    out.setdefault(m, set()).update(c for c in frame.columns if c not in skip)
        return {m: sorted(f) for m, f in out.items()}

    def tag_values(self, key: str) -> list[str]:
        values: set = set()
        for frames in self._worker_frames():
            for frame in frames.values():
                if key in frame.columns:
                    values.update(frame[key].dropna().unique())
        return sorted(values)

    def first_time(self) -> Optional[int]:
        times = [int(f["time"].min()) for frames in self._worker_frames() for f in frames.values() if not f.empty]
        return min(times) if times else None

    def last_time(self) -> Optional[int]:
        times = [int(f["time"].max()) for frames in self._worker_frames() for f in frames.values() if not f.empty]
        return max(times) if times else None

    # --- samples -----------------------------------------------------------
    def frame(
        self,
        measurement: str,
        fields: list[str],
        worker: Optional[str],
        job: Optional[int] = None,
        tags: tuple = (),
        host: Optional[str] = None,
    ) -> pd.DataFrame:
        """Long samples of one worker (as InfluxDB answers them); with ``host`` (and ``worker=None``)
        every worker's points of that host, with a ``worker`` column."""
        device = measurement in DEVICE_MEASUREMENTS
        if host is not None:
            parts = [f[measurement] for f in self._worker_frames() if measurement in f and "host" in f[measurement]]
            parts = [f[f["host"] == host] for f in parts]
            frame = pd.concat(parts, ignore_index=True) if parts else None
            tags = (*tags, "worker")
        else:
            frame = self._folders.get(worker, {}).get(measurement)
        if frame is None or frame.empty:
            return empty_frame(fields, device).assign(**{t: [] for t in tags if t == "worker"})
        cols = ["time", "job", "dag"] + (["index"] if device and "index" in frame.columns else [])
        cols += [t for t in tags if t in frame.columns and t not in cols] + [f for f in fields if f in frame.columns]
        frame = frame[cols]
        present = [f for f in fields if f in frame.columns]
        frame = frame[frame[present].notna().any(axis=1)] if present else frame.iloc[:0]
        if job is not None:
            frame = frame[jobtags.series_contains(frame["job"], job)]
        return frame.sort_values("time", kind="stable").reset_index(drop=True)

    def max_by(self, measurement: str, field: str, by: tuple, workers=None, job=None, busy=False) -> pd.DataFrame:
        """Client-side ``MAX(field) GROUP BY by`` (the spool has no server); ``busy``: ``dag != "0"`` only."""
        parts = []
        for worker in workers if workers is not None else list(self._folders):
            frame = self.frame(measurement, [field], worker, job, tags=tuple(t for t in by if t != "worker"))
            if busy:
                frame = frame[jobtags.busy(frame["dag"])]
            if field in frame.columns and not frame.empty:
                parts.append(frame.assign(worker=worker))
        if not parts:
            return pd.DataFrame(columns=list(by) + ["max"])
        frame = pd.concat(parts)
        for t in by:
            if t not in frame.columns:
                frame[t] = ""
        grouped = frame.groupby(list(by), dropna=False)[field].max()
        return grouped.rename("max").reset_index()

    def dag_points(self) -> pd.DataFrame:
        """The scheduler's ``dag`` points of every session read, each with its ``session`` (from its folder
        where the points carry none: written before sessions were tagged)."""
        parts = []
        for session in self.folders:
            folder = os.path.join(session, SCHEDULER_DIR)
            if not os.path.isdir(folder):
                continue
            points, self.skipped[folder], _ = read_points(folder)
            frame = _long(points, schema.DAG)
            if not frame.empty:
                named = frame[SESSION] if SESSION in frame.columns else pd.Series(None, index=frame.index, dtype=object)
                parts.append(frame.assign(**{SESSION: named.fillna(os.path.basename(session))}))
        return self._filter(pd.concat(parts, ignore_index=True)) if parts else pd.DataFrame()

    def points(self, measurement: str, columns: list[str]) -> pd.DataFrame:
        """Every point of ``measurement`` in range, from every worker (``delivery``: every sender's folder, the
        scheduler's too): ``time`` and ``columns``."""
        if measurement == schema.DELIVERY:
            senders = self._paths + [os.path.join(f, SCHEDULER_DIR) for f in self.folders]
            every = [self._frames(f) for f in senders if os.path.isdir(f)]
        else:
            every = list(self._worker_frames())
        frames = [f[measurement] for f in every if measurement in f and not f[measurement].empty]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        frame = frame.reindex(columns=["time"] + list(columns))
        return frame.sort_values("time", kind="stable").reset_index(drop=True)

    def last_by(self, measurement: str, fields: list[str], by: tuple) -> pd.DataFrame:
        """Per distinct value of the tags ``by`` (a tag a point lacks: ""), each field's last value in range,
        from every sender's folder (not only workers': the agent writes ``accounting`` points)."""
        frames = [
            f[measurement] for f in map(self._frames, self._paths) if not f.get(measurement, pd.DataFrame()).empty
        ]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if frame.empty:
            return pd.DataFrame(columns=list(by) + list(fields))
        frame = frame.reindex(columns=["time", *by, *fields]).sort_values("time", kind="stable")
        frame[list(by)] = frame[list(by)].astype(object).fillna("").astype(str)  # a tag a point lacks: ""
        last = frame.groupby(list(by), sort=True)[list(fields)].last()  # each column's last non-null value
        return last.reset_index()[list(by) + list(fields)]
