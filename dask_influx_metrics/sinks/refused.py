"""What InfluxDB refused as data: which lines of a batch (from its partial-write answers), and the folder they
are kept in, each refusal's reason appended to its ``reasons.txt`` (0600, as every file here)."""

from __future__ import annotations

import logging
import os
import re
import time

from .. import lineparse
from .paths import REASONS_FILE
from .spool import SpoolSink

logger = logging.getLogger(__name__)


class RefusedFolder:
    """``folder``: where refused lines are kept (written through: they are the only copy) with the reasons."""

    def __init__(self, folder):
        self.folder = os.fspath(folder)
        self._sink = SpoolSink(folder, flush_interval=3600)

    def keep(self, lines: list[bytes], reason: str) -> None:
        self._sink.send(lines)
        self._sink.flush()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        text = " | ".join(reason.splitlines())[:4000]
        try:
            fd = os.open(os.path.join(self.folder, REASONS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with open(fd, "a", encoding="utf-8") as f:
                f.write(f"{stamp} {text}\n")
        except OSError as e:
            logger.warning("HTTP sink: cannot write the refusal reason into %s: %s", self.folder, e)

    def close(self) -> None:
        self._sink.close()


_PARTIAL = re.compile(r"partial write")
_DROPPED = re.compile(r"dropped=(\d+)\s*$")
_WRITTEN = re.compile(r"\((\d+) written\)")  # 2.x: "partial write error (5 written): ..."
_CONFLICT = re.compile(r'field type conflict: input field "((?:[^"\\]|\\.)*)" on measurement "((?:[^"\\]|\\.)*)"')
_UNPARSABLE = "unable to parse '"


def refused_lines(batch: list[bytes], reason: str) -> tuple[list[bytes], int]:
    """Which lines of ``batch`` to keep as refused, and how many the server dropped, from its error text.

    Not a partial write: all of them. A partial write (InfluxDB 1.x: ``partial write: <why> dropped=N``,
    lines that did not parse named as ``unable to parse '<line>': <why>``; a field type conflict names its
    measurement and field): the named lines plus the conflicting ones when those are exactly the N
    dropped, else the whole batch (the accepted lines in it are rewritten, idempotently, on replay).

    >>> batch = [b"gpu,h=a u=1 1", b"host,h=a m=2 1", b"gpu,h=a u=3 2"]
    >>> reason = 'partial write: field type conflict: input field "u" on measurement "gpu" is type float, ' \\
    ...     'already exists as type string dropped=2'
    >>> refused_lines(batch, reason)
    ([b'gpu,h=a u=1 1', b'gpu,h=a u=3 2'], 2)
    >>> refused_lines(batch, "partial write: unable to parse 'host,h=a m=2 1': bad dropped=0")
    ([b'host,h=a m=2 1'], 1)
    >>> refused_lines(batch, "points beyond retention policy")[1]
    3
    """
    if not _PARTIAL.search(reason):
        return list(batch), len(batch)
    text = {line.decode("utf-8", "replace"): line for line in batch}
    named = []
    for part in reason.split("\n"):
        at = part.find(_UNPARSABLE)
        if at >= 0:
            line = part[at + len(_UNPARSABLE) :].rpartition("': ")[0]
            if line in text:
                named.append(text[line])
    m, w = _DROPPED.search(reason), _WRITTEN.search(reason)
    dropped = int(m.group(1)) if m else (len(batch) - len(named) - int(w.group(1)) if w else len(batch) - len(named))
    dropped = max(0, min(dropped, len(batch) - len(named)))
    conflict = _CONFLICT.search(reason)
    others = [line for line in batch if line not in named]
    if conflict and dropped:
        field, measurement = (re.sub(r"\\(.)", r"\1", g) for g in conflict.groups())
        suspects = [line for line in others if _has_field(line, measurement, field)]
        if len(suspects) == dropped:
            return named + suspects, len(named) + dropped
    return (named + others if dropped else named), len(named) + dropped


def _has_field(line: bytes, measurement: str, field: str) -> bool:
    try:
        point = lineparse.parse(line)
    except ValueError:
        return False
    return point.measurement == measurement and field in point.fields
