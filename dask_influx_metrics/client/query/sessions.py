"""Which monitoring session a Store reads: the one place where readers pick sessions.

Every point carries its session's id (the tag ``session``; a string field with ``session-tag:
false``), and job and DAG numbers restart at 1 in each session, so a database holding several must be
read one session at a time. :func:`select` (called by ``connect()``) decides which from ``session=``:

* ``None``: the latest (by start), named in a note when the source holds others;
* an id (or :data:`UNNAMED`): that one, without a query (a wrong id reads nothing, and
  ``Store.not_found`` lists the sessions there);
* ``"all"``: every session, with a note (numbers then repeat);
* an index, 1-based from the latest (``2``: the one before the latest), as ``sessions()`` numbers them.

A backend answers two things: ``session_rows(detail)`` (what sessions its source holds, within its time
range and extra tags) and ``select_session(id)`` (read only that one). The InfluxQL and Flux backends
add the session to the extra ``tags`` every question of theirs is filtered by (:func:`select_in_tags`),
so a new query built with the backend's tags (``where_clause(self.tags, ...)``, ``predicate(..., tags)``)
reads one session with nothing more to do; the spool reads that session's folder. Points written before
sessions were tagged have no id: they are one session, :data:`UNNAMED`, which may hold several runs (a
note says so; narrow it with ``start``/``stop``).

>>> rows = pd.DataFrame({"session": ["20240502T120000-000002-aaaaaa", "", "20240501T120000-000001-bbbbbb"],
...                      "first": [3, 1, 2]})
>>> order(rows)
['', '20240501T120000-000001-bbbbbb', '20240502T120000-000002-aaaaaa']
>>> choose(order(rows), "2", "db")
(['20240501T120000-000001-bbbbbb'], "read session '20240501T120000-000001-bbbbbb', 2 of 3 in db counting from the latest")
"""

from __future__ import annotations

import logging
from typing import Optional

import pandas as pd

from ... import jobtags, schema
from ...names import session_start_ns
from .base import QueryError

logger = logging.getLogger(__name__)
SESSION = schema.SESSION
UNNAMED = "unnamed"  # the points without a session id (written before sessions were tagged)
ALL = "all"
CHOOSE = 'choose with session= (CLI: --session): an id, an index from the latest (2 = the one before), or "all"'
SESSION_COLUMNS = ["index", "session", "start", "end", "workers", "jobs", "hosts"]


def name(session: Optional[str]) -> str:
    """A session as readers show it: its id, or :data:`UNNAMED` for points without one."""
    return session or UNNAMED


def _start(rows: pd.DataFrame) -> pd.Series:
    """Each session's start (ns): what its id says, else its first point."""
    first = rows.dropna(subset=["first"]).groupby("session")["first"].min()
    named = pd.Series({s: session_start_ns(s) for s in first.index}, dtype=object)
    return named.where(named.notna(), first).astype("int64")


def order(rows: pd.DataFrame) -> list[str]:
    """The sessions in ``rows`` (``session``, ``first``: a backend's :meth:`session_rows`), oldest first;
    the points without an id first of all (written before sessions were tagged, or by another tool: never
    the latest while a session has an id)."""
    if rows.empty:
        return []
    start = _start(rows)
    return sorted(start.index, key=lambda s: (s != "", int(start[s]), s))


def _index(wanted) -> Optional[int]:
    if isinstance(wanted, bool):
        return None
    if isinstance(wanted, int):
        return wanted
    return int(wanted) if isinstance(wanted, str) and wanted.strip().isdigit() else None


def choose(found: list[str], wanted, where: str) -> tuple[Optional[list[str]], str]:
    """``(the sessions to read, or None for all; a note, or "")`` among ``found`` (oldest first)."""
    shown = [name(s) for s in found]
    if wanted is not None and str(wanted) == ALL:
        if len(found) < 2:
            return None, ""
        return None, (
            f"read all {len(found)} sessions in {where} together ({shown}): job and DAG numbers restart at 1 "
            "in each, so one number may name several jobs; dags() has a session column"
        )
    index = _index(wanted)
    if index is not None:
        if not 1 <= index <= len(found):
            raise QueryError(
                f"no session {index} in {where}: {len(found)} session(s), 1 = the latest; newest first: {shown[::-1]}"
            )
        chosen = found[-index]
        return [chosen], f"read session {name(chosen)!r}, {index} of {len(found)} in {where} counting from the latest"
    if wanted is not None:
        raise ValueError(f"session must be an id, 'all' or an index from 1, got {wanted!r}")
    chosen = found[-1]
    if len(found) == 1:
        return [chosen], (unnamed_note(where) if chosen == "" else "")
    others = shown[:-1][::-1]
    note = (
        f"read session {name(chosen)!r}, the latest of {len(found)} in {where} (the {len(others)} other(s), "
        f"newest first: {others[:5]}{' ...' if others[5:] else ''}); {CHOOSE}"
    )
    return [chosen], note


def unnamed_note(where: str) -> str:
    return (
        f"the points in {where} carry no session id (written before sessions were tagged): read as one "
        f"session, {UNNAMED!r}, which may hold several runs whose job and DAG numbers each restart at 1; "
        "narrow it with start=/stop= (CLI: --start/--stop)"
    )


def select(backend, wanted) -> str:
    """Narrow ``backend`` to the session(s) ``wanted`` names (see the module docstring); returns the note
    that says which, or ""."""
    if wanted is not None and str(wanted) != ALL and _index(wanted) is None:
        if not isinstance(wanted, str) or not wanted:
            raise ValueError(f"session must be an id, 'all' or an index from 1, got {wanted!r}")
        backend.select_session("" if wanted == UNNAMED else wanted)  # no question asked
        return ""
    found = order(backend.session_rows())
    if not found:
        return ""  # nothing there: the questions say what the source holds
    chosen, note = choose(found, wanted, backend.describe())
    if chosen is not None and found != [""]:  # only points without an id: all of them, as before sessions
        backend.select_session(chosen[0])
        if chosen[0] == "" and len(found) > 1:
            note += "; " + unnamed_note(backend.describe())
    if note:
        logger.info("%s", note)
    return note


def select_in_tags(backend, session: str) -> None:
    """``select_session`` of a backend whose every question is filtered by its ``tags`` (InfluxQL, Flux): the
    session becomes one of them (``""``: the points without one, as InfluxQL's ``"session" = ''`` reads)."""
    backend.tags = {**backend.tags, SESSION: session}
    backend.session = session


def table(rows: pd.DataFrame, store_workers=None) -> pd.DataFrame:
    """``sessions()``: one row per session, newest first: ``index`` (1 = the latest: what ``session=``
    takes), ``session``, ``start``, ``end`` (UTC), and how many ``workers`` (Dask addresses), ``jobs`` and
    ``hosts`` wrote points. ``rows``: a backend's ``session_rows(detail=True)``."""
    if rows.empty:
        return pd.DataFrame(columns=SESSION_COLUMNS)
    ordered = order(rows)[::-1]
    start = _start(rows)
    out = []
    for i, s in enumerate(ordered, 1):
        mine = rows[rows["session"] == s]
        workers = mine["worker"].dropna().astype(str)
        workers = workers[workers.map(store_workers)] if store_workers is not None else workers
        out.append(
            {
                "index": i,
                "session": name(s),
                "start": pd.Timestamp(int(start[s]), unit="ns", tz="UTC"),
                "end": pd.Timestamp(int(mine["last"].max()), unit="ns", tz="UTC"),
                "workers": workers.nunique(),
                "jobs": len(jobtags.distinct(mine["job"].dropna().astype(str).unique())),
                "hosts": mine["host"].dropna().nunique(),
            }
        )
    return pd.DataFrame(out, columns=SESSION_COLUMNS)
