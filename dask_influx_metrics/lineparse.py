"""Line protocol -> points: :func:`parse`, the exact inverse of :func:`.lineprotocol.encode`, and
:func:`split_lines` for a stream (the spool is read back with them).

>>> parse(b'gpu,index=0 utilization_gpu=87 1').fields
{'utilization_gpu': 87.0}
"""

from __future__ import annotations

import re

from .schema import Point

_FLOAT_TEXT = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\Z")


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Split a stream of newline-joined lines, honouring newlines inside strings.

    Returns the complete lines (empty ones left out) and the unterminated
    rest: a partial last line, or ``b""``.

    >>> split_lines(b'm s="a\\nb" 1\\nm v=2i 2\\nm v=')
    ([b'm s="a\\nb" 1', b'm v=2i 2'], b'm v=')
    """
    segments = data.split(b"\n")
    rest = segments.pop()
    lines: list[bytes] = []
    record = None
    for segment in segments:
        record = segment if record is None else record + b"\n" + segment
        if b'"' in record and _ends_quoted(record):
            continue  # the newline is inside a string value
        if record.strip():
            lines.append(record)
        record = None
    if record is not None:
        rest = record + b"\n" + rest
    return lines, rest


_TOKENS = re.compile(rb'\\[\s\S]|[ ,="]|[^\\ ,="]+')


def _ends_quoted(record: bytes) -> bool:
    """Whether ``record`` ends inside a string value (InfluxDB 1.x ``scanLine`` rules)."""
    fields = quoted = False
    equals = commas = 0
    for token in _TOKENS.findall(record):
        if token == b" ":
            fields = True
        elif fields and not quoted and token == b"=":
            equals += 1
        elif fields and not quoted and token == b",":
            commas += 1
        elif fields and token == b'"' and equals > commas:
            quoted = not quoted
    return quoted


def _scan(text: str, i: int, stops: str) -> int:
    """Index of the first char in ``stops`` at or after ``i`` not preceded by ``\\``."""
    n = len(text)
    while i < n and (text[i] not in stops or (i > 0 and text[i - 1] == "\\")):
        i += 1
    return i


def _unescape(text: str, codes: str) -> str:
    if "\\" not in text:
        return text
    out, i, n = [], 0, len(text)
    while i < n:
        if text[i] == "\\" and i + 1 < n and text[i + 1] in codes:
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _parse_value(text: str, line: str):
    if text.endswith(("i", "u")) and text[:-1].lstrip("-").isdigit():
        return int(text[:-1])
    if text in ("t", "T", "true", "True", "TRUE"):
        return True
    if text in ("f", "F", "false", "False", "FALSE"):
        return False
    if _FLOAT_TEXT.match(text):
        return float(text)
    raise ValueError(f"bad field value {text!r} in line {line!r}")


def parse(line) -> Point:
    """Read one line written by :func:`encode` back into a :class:`Point`.

    Unescapes exactly as InfluxDB 1.x does. Raises ``ValueError`` on a
    malformed line. ``time_ns`` is ``None`` when the line has no timestamp.

    >>> parse(b'gpu,name=A100\\\\ SXM used=1.5,n=2i,ok=true,s="x" 7')
    Point(measurement='gpu', tags={'name': 'A100 SXM'}, fields={'used': 1.5, 'n': 2, 'ok': True, 's': 'x'}, time_ns=7)
    """
    text = line.decode("utf-8") if isinstance(line, (bytes, bytearray)) else str(line)
    text = text.rstrip("\n")
    n = len(text)
    i = _scan(text, 0, ", ")
    measurement = _unescape(text[:i], ',=" ')
    if not measurement or i >= n:
        raise ValueError(f"no measurement or no fields in line {text!r}")
    tags = {}
    while text[i] == ",":
        j = _scan(text, i + 1, "=")
        k = _scan(text, j + 1, ", ")
        if j >= n or k >= n or j == i + 1 or k == j + 1:
            raise ValueError(f"bad tag at {i} in line {text!r}")
        tags[_unescape(text[i + 1 : j], ",= ")] = _unescape(text[j + 1 : k], ",= ")
        i = k
    fields = {}
    while i < n and (text[i] == " " and not fields or text[i] == ","):
        j = _scan(text, i + 1, "=")
        if j >= n - 1 or j == i + 1:
            raise ValueError(f"bad field at {i} in line {text!r}")
        key = _unescape(text[i + 1 : j], ',=" ')
        if text[j + 1] == '"':
            k = j + 2
            while k < n and text[k] != '"':
                k += 2 if text[k] == "\\" else 1
            if k >= n:
                raise ValueError(f"unterminated string in line {text!r}")
            fields[key] = _unescape(text[j + 2 : k], '\\"')
            i = k + 1
        else:
            k = _scan(text, j + 1, ", ")
            fields[key] = _parse_value(text[j + 1 : k], text)
            i = k
    time_ns = None
    rest = text[i:].strip(" ")
    if rest:
        if not rest.lstrip("-").isdigit():
            raise ValueError(f"bad timestamp {rest!r} in line {text!r}")
        time_ns = int(rest)
    if not fields:
        raise ValueError(f"no fields in line {text!r}")
    return Point(measurement, tags, fields, time_ns)
