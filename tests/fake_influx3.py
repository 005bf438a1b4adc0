"""A fake InfluxDB 3 Core for the tests: the documented 3.x rules in front of a real influxd 1.x.

What it enforces, as InfluxDB 3 Core (3.9) documents it and its source does:

- **Tokens.** Every request needs the token: ``Authorization: Bearer <t>`` or ``Token <t>``,
  Basic with the token as password, or ``p=<t>`` on ``/write`` and ``/query``; else 401.
- **Writes** on ``POST /write`` (``db``; ``rp`` other than ``autogen`` writes to database
  ``db/rp``; precision ``ns``/``u``/``ms``/``s``...), ``/api/v2/write`` (``bucket``, ``org``
  ignored; ``ns``/``us``/``ms``/``s``) and ``/api/v3/write_lp`` (``db``; ``auto`` by default,
  ``nanosecond``/... or ``ns``/...). A database is created by its first write.
- **Columns.** Within a table a tag and a field may not share a name, and a column keeps its
  first kind (tag, or a field type). Lines that break a rule are rejected and the others written
  (a partial write: HTTP 400 listing the rejected lines).
- **No UDP, no Flux**: ``/api/v2/query`` is 404.
- **InfluxQL** on ``/query`` and ``/api/v3/query_influxql``, run by influxd on the accepted
  points. CSV answers come in 3.x's form: the ``tags`` cell is ``k=v,k=v`` sorted by key with
  nothing escaped (quoted when it holds a comma); a failing statement gives an empty CSV body
  (3.x drops it); ``SHOW DATABASES`` lists the 3.x names.

Not modelled: InfluxQL features 3.x lacks, the query time window, limits on databases/columns.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import threading
import urllib.parse
import uuid

import requests
from fake_influx2 import LoopbackServer

PRECISION = {  # endpoint -> {accepted name: influxd 1.x name}
    "/write": {"ns": "ns", "n": "ns", "u": "u", "µ": "u", "ms": "ms", "s": "s", "m": "m", "h": "h"},
    "/api/v2/write": {"ns": "ns", "us": "u", "ms": "ms", "s": "s"},
    "/api/v3/write_lp": {
        "nanosecond": "ns",
        "ns": "ns",
        "n": "ns",
        "microsecond": "u",
        "us": "u",
        "u": "u",
        "millisecond": "ms",
        "ms": "ms",
        "second": "s",
        "s": "s",
        "auto": "auto",
    },
}


def split(text: str, sep: str, quotes: bool = True, limit: int = -1) -> list[str]:
    """Split line protocol on ``sep`` outside backslash escapes (and double-quoted strings)."""
    parts, cur, quoted, i = [], [], False, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if c == '"' and quotes:
            quoted = not quoted
        if c == sep and not quoted and limit != 0:
            limit -= 1
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    return parts + ["".join(cur)]


def field_type(value: str) -> str:
    if value.startswith('"'):
        return "string"
    if value in ("t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE"):
        return "bool"
    return {"i": "int", "u": "uint"}.get(value[-1:], "float")


def parse(line: str) -> tuple[str, dict[str, str], int]:
    """``(table, {column: kind}, time)`` of one line; raises ValueError on a malformed line."""
    head, rest = (split(line, " ", quotes=False, limit=1) + [""])[:2]
    fields, *stamp = split(rest, " ")
    key, *tags = split(head, ",", quotes=False)
    if not key or not fields:
        raise ValueError("no measurement or no fields")
    tag_names = [split(t, "=", quotes=False)[0] for t in tags]
    field_pairs = [split(f, "=") for f in split(fields, ",")]
    if any(len(p) != 2 for p in field_pairs):
        raise ValueError("malformed field")
    clash = set(tag_names) & {p[0] for p in field_pairs}
    if clash:
        raise ValueError(f"tag and field with the same name: {sorted(clash)}")
    kinds = {**{t: "tag" for t in tag_names}, **{name: field_type(v) for name, v in field_pairs}}
    return key, kinds, int(stamp[0]) if stamp and stamp[0] else 0


class FakeInflux3(LoopbackServer):
    """An InfluxDB 3 Core stand-in on 127.0.0.1 storing into ``influxd`` (see the module docstring)."""

    def __init__(self, influxd, token: str = "apiv3_fake-token"):
        self.influxd, self.token = influxd, token
        self.prefix = "x3_" + uuid.uuid4().hex[:8] + "_"
        self.databases: set[str] = set()
        self.columns: dict[tuple[str, str], dict[str, str]] = {}
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self.serve()

    # --- the rules ----------------------------------------------------------------------
    def authorized(self, path: str, params: dict, headers) -> bool:
        scheme, _, value = (headers.get("Authorization") or "").partition(" ")
        if scheme == "Basic":
            value = base64.b64decode(value).decode().rpartition(":")[2]
        elif scheme not in ("Bearer", "Token"):
            value = params.get("p") if path in ("/write", "/query") else None
        return value == self.token

    def handle(self, method: str, path: str, params: dict, headers, body: bytes) -> tuple[int, str, str]:
        self.requests.append({"method": method, "path": path, "params": params, "headers": dict(headers)})
        if not self.authorized(path, params, headers):
            return 401, "application/json", json.dumps({"error": "the request was not authenticated"})
        if method == "POST" and path in PRECISION:
            return self.write(path, params, body.decode())
        if path in ("/query", "/api/v3/query_influxql"):
            if method == "POST" and not params.get("q"):
                params = {**params, **dict(urllib.parse.parse_qsl(body.decode()))}
            return self.query(params, headers.get("Accept", ""))
        return 404, "application/json", json.dumps({"error": f"not found: {path}"})

    def database(self, path: str, params: dict) -> str:
        if path == "/api/v2/write":
            return params.get("bucket", "")
        rp = params.get("rp")
        return params.get("db", "") + (f"/{rp}" if rp and rp != "autogen" else "")

    def write(self, path: str, params: dict, text: str) -> tuple[int, str, str]:
        db = self.database(path, params)
        precision = PRECISION[path].get(params.get("precision", "auto" if path.endswith("write_lp") else "ns"))
        if not db or precision is None:
            return 400, "application/json", json.dumps({"error": f"bad db or precision: {params}"})
        accepted, rejected = [], []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            try:
                self.check(db, *parse(line)[:2])
                accepted.append(line)
            except ValueError as e:
                rejected.append({"original_line": line, "line_number": number, "error_message": str(e)})
        if accepted:
            self.store(db, accepted, precision)
        if rejected:
            return (
                400,
                "application/json",
                json.dumps({"error": "partial write of line protocol occurred", "data": rejected}),
            )
        return 204, "text/plain", ""

    def check(self, db: str, table: str, kinds: dict[str, str]) -> None:
        """A column keeps its first kind; a tag name never becomes a field name, nor the reverse."""
        with self._lock:
            known = self.columns.setdefault((db, table), {})
            for name, kind in kinds.items():
                if known.get(name, kind) != kind:
                    raise ValueError(f"column {name!r} of table {table!r} is {known[name]}, not {kind}")
            known.update(kinds)

    def store(self, db: str, lines: list[str], precision: str) -> None:
        if precision == "auto":  # 3.x guesses from the magnitude of the first timestamp
            t = parse(lines[0])[2]
            precision = "s" if t < 5e9 else "ms" if t < 5e12 else "u" if t < 5e15 else "ns"
        if db not in self.databases:
            requests.post(
                self.influxd.url + "/query", params={"q": f'CREATE DATABASE "{self.real(db)}"'}, timeout=10
            ).raise_for_status()
            self.databases.add(db)
        r = requests.post(
            self.influxd.url + "/write",
            params={"db": self.real(db), "precision": precision},
            data="\n".join(lines).encode(),
            timeout=10,
        )
        r.raise_for_status()

    def real(self, db: str) -> str:
        return self.prefix + re.sub(r"\W", "_", db)

    # --- InfluxQL -----------------------------------------------------------------------
    def query(self, params: dict, accept: str) -> tuple[int, str, str]:
        q = params.get("q", "")
        csv_wanted = accept in ("application/csv", "text/csv")
        if q.strip().upper() == "SHOW DATABASES":
            values = [[n] for n in sorted(self.databases)]
            answer = {
                "results": [
                    {"statement_id": 0, "series": [{"name": "databases", "columns": ["name"], "values": values}]}
                ]
            }
            return 200, "application/json", json.dumps(answer)
        db = self.real(self.database("/query", params))
        r = requests.get(
            self.influxd.url + "/query",
            timeout=30,
            params={"q": q, "db": db, **({"epoch": params["epoch"]} if "epoch" in params else {})},
            headers={"Accept": "application/csv" if csv_wanted else "application/json"},
        )
        if not csv_wanted:
            return 200, "application/json", r.text
        if r.status_code >= 400 or r.text.startswith("error"):
            return 200, "application/csv", ""  # 3.x drops a failing statement from a CSV answer
        return 200, "application/csv", v3_csv(r.text)


def v3_csv(text: str) -> str:
    """influxd 1.x CSV -> InfluxDB 3's: the tags cell unescaped, sorted by key."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in csv.reader(io.StringIO(text)):
        if len(row) > 1 and row[:2] != ["name", "tags"] and row[1]:
            pairs = [p.partition("=") for p in re.split(r"(?<!\\),", row[1])]
            row[1] = ",".join(f"{unescape(k)}={unescape(v)}" for k, _, v in sorted(pairs))
        writer.writerow(row)
    return out.getvalue()


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)
