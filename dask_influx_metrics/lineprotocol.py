r"""InfluxDB line protocol: ``encode`` a :class:`~.schema.Point` (:mod:`.lineparse` parses it back).

One point is one line, ``measurement[,tag=value...] field=value[,...] [time_ns]``,
UTF-8, tags sorted by key. Field values: ``float`` -> shortest text that
round-trips (``repr``'s digits, written by orjson: ``1e-7`` where ``repr`` has
``1e-07``), ``int`` -> ``<n>i``, ``bool`` -> ``true``/``false``,
``str`` -> ``"..."``. ``parse(encode(p))`` gives back ``p`` exactly whenever
every name and value is representable, and otherwise the normalised point
described below, which is also exactly what InfluxDB 1.6.7 stores (checked
against the real server by ``tests/test_lineprotocol.py``).

Policy for what line protocol cannot carry (deterministic; nothing raises)
--------------------------------------------------------------------------
Names (measurement, tag key, tag value, field key):

1. Control characters U+0000-U+001F and U+007F become a space. InfluxDB 1.x
   ends the line at a newline even when it is backslash-escaped (``\<LF>``
   is stored *with* the backslash), Telegraf's parser rejects the whole line
   for TAB/LF/FF/CR, and the v2 ``line-protocol`` parser for any of them.
2. A backslash is kept verbatim (``a\b`` and ``a\\b`` round-trip) except a
   run of backslashes that ends the text: there is no encoding for it in any
   parser (the delimiter after it reads as escaped; 1.6.7 folded
   ``m\,t=a`` into a measurement named ``m,t=a``), so it is removed (as
   Telegraf's serializer does). In measurements and field keys a run of
   backslashes directly before ``,`` ``=`` space or ``"`` is removed too:
   1.x unescapes those pairs there (measurement names even twice, leaving
   series that ``SELECT`` cannot find), and its field scanner takes ``\\``
   as a pair, so ``f\\,x=1`` does not parse. In tag keys and values such a
   backslash is exact (``a\,b`` is written ``a\\,b`` and stored ``a\,b``).
3. A measurement starting with ``#`` would turn the line into a comment
   (1.x drops it silently), so it is written ``\#...`` and stored that way
   by 1.x, Telegraf and the v2 parser alike.
4. Afterwards an empty measurement drops the point; an empty tag key or value
   drops the tag (line protocol has no empty tag value); an empty field key,
   or a tag/field key ``time`` (1.x rejects the whole point for it), drops
   that tag/field; when two keys clean up to the same text the first wins
   (tags in sorted order of the original keys, fields in dict order).

String field values round-trip exactly (``\`` and ``"`` are escaped; LF,
CRLF, TAB, NUL are written raw, which 1.x, Telegraf and v2 all accept inside
quotes), except a CR not followed by LF and a form feed, which become a
space: Telegraf's grammar has no way to accept them. So a line may span
several physical lines; use :func:`.lineparse.split_lines` to read a stream back.

Field values that cannot be written are dropped, and the point only if no
field is left: NaN/+-inf floats, ints outside int64 and values of other types
(``None`` is skipped silently). Lone surrogates, which UTF-8 cannot encode,
become ``?``. Each drop is counted in the module-level :data:`stats`.

Known differences between parsers for lines this module writes: Telegraf's
``influx`` parser unescapes ``\"`` in tag keys/values (1.x and v2 keep the
backslash), so a tag containing backslash-quote loses that backslash on the
Telegraf path; InfluxDB 2.x rejects tag keys ``_field`` and ``_measurement``
(1.x accepts them), which this module does not rewrite.

>>> from dask_influx_metrics.lineparse import parse
>>> from dask_influx_metrics.schema import Point
>>> line = encode(Point("gpu", {"name": "A100 SXM", "index": "0"},
...                     {"utilization_gpu": 12.5, "tasks": 3}, 1700000000000000000))
>>> line
b'gpu,index=0,name=A100\\ SXM utilization_gpu=12.5,tasks=3i 1700000000000000000'
>>> parse(line).tags
{'index': '0', 'name': 'A100 SXM'}
"""

from __future__ import annotations

import math
import numbers
import re
from collections import Counter
from typing import Iterable, Optional

import orjson

from .schema import Point

#: Counts of what the encoder dropped, by reason: ``nonfinite`` (NaN/inf
#: float fields), ``int_range``, ``unsupported_type``, ``empty_key``,
#: ``reserved_key``, ``duplicate_key`` (fields or tags) and ``points`` (points
#: with no measurement or no field left). Cumulative for the process; reset
#: with ``stats.clear()``.
stats: Counter = Counter()

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TRAILING_BS = re.compile(r"\\+\Z")
_BS_BEFORE_SPECIAL = re.compile(r'\\+(?=[,= "]|\Z)')
_STRING_CR_FF = re.compile(r"\r(?!\n)|\f")
_MEASUREMENT_ESC = str.maketrans({",": r"\,", " ": r"\ "})
_KEY_ESC = str.maketrans({",": r"\,", " ": r"\ ", "=": r"\="})
_RESERVED = frozenset({"time"})


def _clean(text, backslashes: re.Pattern) -> str:
    text = str(text)
    if _CONTROL.search(text):
        text = _CONTROL.sub(" ", text)
    if "\\" in text:
        text = backslashes.sub("", text)
    return text


def _measurement(name) -> str:
    text = _clean(name, _BS_BEFORE_SPECIAL).translate(_MEASUREMENT_ESC)
    return "\\" + text if text.startswith("#") else text


def _string(value: str) -> str:
    """A string field's text between its quotes (``replace`` is several times faster than ``translate``)."""
    if "\r" in value or "\f" in value:
        value = _STRING_CR_FF.sub(" ", value)
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    return value.replace('"', '\\"') if '"' in value else value


def _field_value(value) -> Optional[str]:
    kind = type(value)
    if kind is float:
        if value - value == 0.0:  # finite (NaN and inf give NaN)
            return _float_text(value)
        stats["nonfinite"] += 1
        return None
    if kind is int and _INT64_MIN <= value <= _INT64_MAX:
        return f"{value}i"
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + _string(value) + '"'
    if isinstance(value, numbers.Integral):
        number = int(value)
        if _INT64_MIN <= number <= _INT64_MAX:
            return f"{number}i"
        stats["int_range"] += 1
        return None
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number):
            return _float_text(number)
        stats["nonfinite"] += 1
        return None
    stats["unsupported_type"] += 1
    return None


def _key_ok(key: str, seen) -> bool:
    reason = (
        "empty_key" if not key else "reserved_key" if key in _RESERVED else ("duplicate_key" if key in seen else None)
    )
    if reason:
        stats[reason] += 1
    return reason is None


# Samples repeat the same series every interval: escaping each distinct
# ``measurement,tags `` prefix, tag and field key once makes encoding several times
# cheaper. When a job or DAG starts, every series of the sample gets a new prefix:
# the tags that did not change are found escaped already. Bounded: :func:`encode_many`
# clears them between batches once one holds ``_CACHE_LIMIT`` entries (within a
# batch they may grow past it). Drops of tags are counted in ``stats`` once per
# distinct prefix.
_CACHE_LIMIT = 4096
_prefixes: dict = {}
_tags: dict = {}
_field_keys: dict = {}


def _prefix(measurement, tags) -> Optional[str]:
    """``measurement,k=v,... `` (with the trailing space), or None if unwritable."""
    try:
        cache_key = (measurement, tuple(tags.items()))
        return _prefixes[cache_key]
    except KeyError:
        pass
    except TypeError:  # unhashable values: encode without the cache
        return _build_prefix(measurement, tags)
    _prefixes[cache_key] = result = _build_prefix(measurement, tags)
    return result


def _build_prefix(measurement, tags) -> Optional[str]:
    name = _measurement(measurement)
    if not name:
        return None
    clean: dict[str, str] = {}  # cleaned key -> ",key=value", escaped
    for key in sorted(tags, key=str):
        tag = _tag(str(key), tags[key])
        if tag is not None and _key_ok(tag[0], clean):
            clean[tag[0]] = tag[1]
    return "".join([name] + [clean[k] for k in sorted(clean)]) + " "


def _tag(key: str, value) -> Optional[tuple[str, str]]:
    """(cleaned key, ``,key=value`` escaped), cached; None for an empty value (line protocol has none)."""
    try:
        return _tags[key, value]
    except KeyError:
        pass
    except TypeError:  # an unhashable value
        value = str(value)
    text = "" if value is None else _clean(value, _TRAILING_BS)
    clean = _clean(key, _TRAILING_BS)
    _tags[key, value] = result = (clean, f",{clean.translate(_KEY_ESC)}={text.translate(_KEY_ESC)}") if text else None
    return result


def _field_key(key) -> tuple[str, str]:
    """(cleaned key, escaped key), cached."""
    try:
        return _field_keys[key]
    except KeyError:
        pass
    except TypeError:
        key = str(key)
    clean = _clean(key, _BS_BEFORE_SPECIAL)
    _field_keys[key] = result = (clean, clean.translate(_KEY_ESC))
    return result


# The fast path: a sampler writes the same series (measurement, tags, field keys
# and value types) every interval. For a series whose field keys all clean up to
# distinct writable text and whose values are exact ``float``/``int``/``bool``/``str``,
# one template per series (prefix and keys escaped once, ``%b`` for each value)
# writes its lines. :func:`encode_many` fills the templates of a whole batch at
# once: one ``orjson.dumps`` (compiled) writes every number of the batch, ~0.03 us
# a value where ``repr`` costs 0.15-0.3, and one ``%`` writes every line. Its float
# text is the shortest round-trip decimal, as ``repr``'s, in places spelled
# differently (``1e-7`` for ``1e-07``, ``0.00001`` for ``1e-05``): the same float
# for InfluxDB and every other parser; the general path writes floats the same way.
# A batch with a value that may not be writable (NaN, inf, an int beyond 2**53 - 1,
# a string with a newline) is written point by point, each point failing that
# test by the general path, so output and ``stats`` do not depend on the path.
_lines: dict = {}
_fields: dict = {}  # (field keys, value types, untimed) -> the template's part after the prefix
_SPEC = {float: "%b", int: "%bi", bool: "%b", str: '"%b"'}
_NEW = object()  # a series not seen yet


def _float_text(value: float) -> str:
    """Shortest text that reads back as ``value`` (finite floats only)."""
    return orjson.dumps(value).decode()


def _line_template(point: Point) -> Optional[tuple]:
    """``(template, strings)`` writing ``point``'s series (``strings``: the positions of its string fields), or
    None when the fast path does not apply."""
    measurement, tags, fields, time_ns = point
    prefix = _prefix(measurement, tags)
    if prefix is None or not fields or (time_ns is not None and type(time_ns) is not int):
        return None
    kinds = tuple(map(type, fields.values()))
    key = (*fields, *kinds, time_ns is None)
    try:
        rest = _fields[key]
    except KeyError:
        rest = _fields[key] = _fields_template(fields, kinds, time_ns is None)
    if rest is None:
        return None
    strings = tuple(i for i, kind in enumerate(kinds) if kind is str)
    return prefix.replace("%", "%%").encode("utf-8", "replace") + rest, strings


def _fields_template(fields: dict, kinds: tuple, untimed: bool) -> Optional[bytes]:
    """The part of a line template after the prefix, or None when the fast path does not apply."""
    parts, seen = [], set()
    for key, kind in zip(fields, kinds):
        clean, escaped = _field_key(key)
        if kind not in _SPEC or not clean or clean in _RESERVED or clean in seen:
            return None
        seen.add(clean)
        parts.append(escaped.replace("%", "%%") + "=" + _SPEC[kind])
    return (",".join(parts) + ("" if untimed else " %b")).encode("utf-8", "replace")


def prefix(measurement, tags: dict) -> Optional[str]:
    """``measurement,tag=value,... `` as the encoder starts a line of this series (escaped, tags sorted, the
    space before the fields), or None when it writes no line for it. With :func:`string` (a string field's
    text), for a writer making many lines of a few series without building points (the task stream).

    >>> prefix("m", {"t": "a b", "e": ""}) + 'k="' + string('say "hi"') + '" 7'
    'm,t=a\\\\ b k="say \\\\"hi\\\\"" 7'
    """
    return _prefix(measurement, tags)


def string(value: str) -> str:
    """A string field's text between its quotes, as the encoder writes it (see :func:`prefix`)."""
    return _string(value)


def _series(point: Point) -> Optional[tuple]:
    """The cached :func:`_line_template` of ``point``'s series (None: the general path)."""
    measurement, tags, fields, time_ns = point
    # The series, as one flat tuple (the tag count makes it unambiguous).
    key = (measurement, len(tags), *tags, *tags.values(), *fields, *map(type, fields.values()), type(time_ns))
    try:
        return _lines[key]
    except KeyError:
        _lines[key] = entry = _line_template(point)
        return entry
    except TypeError:  # unhashable names or values: the general path
        return None


def encode(point: Point) -> Optional[bytes]:
    """One line of line protocol (no newline), or ``None`` if nothing is writable.

    >>> encode(Point("m", {"t": ""}, {"x": float("nan"), "s": 'say "hi"'}, 5))
    b'm s="say \\\\"hi\\\\"" 5'
    >>> encode(Point("m", {}, {"x": float("inf")}, 5)) is None
    True
    """
    lines = encode_many([point])
    return lines[0] if lines else None


def _general(point: Point) -> Optional[bytes]:
    """:func:`encode` for any point: each field value checked and written on its own."""
    prefix = _prefix(point.measurement, point.tags)
    if prefix is None:
        stats["points"] += 1
        return None
    fields: list[str] = []
    seen: set = set()
    for key, value in point.fields.items():
        text = _field_value(value)
        if text is None:
            continue
        clean = _field_key(key)
        if _key_ok(clean[0], seen):
            seen.add(clean[0])
            fields.append(clean[1] + "=" + text)
    if not fields:
        stats["points"] += 1
        return None
    line = prefix + ",".join(fields)
    if point.time_ns is not None:
        line += f" {int(point.time_ns)}"
    try:
        return line.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return line.encode("utf-8", "replace")


def encode_many(points: Iterable[Point]) -> list[bytes]:
    """Encode each point, leaving out those that :func:`encode` drops.

    >>> encode_many([Point("a", {}, {"v": 1}, 1), Point("b", {}, {}, 2)])
    [b'a v=1i 1']
    """
    if max(len(_lines), len(_prefixes), len(_tags), len(_fields), len(_field_keys)) >= _CACHE_LIMIT:
        for cache in (_lines, _prefixes, _tags, _fields, _field_keys):  # between batches only, so that a batch
            cache.clear()  # written again point by point finds what it built (and counts no drop twice)
    return _batch(points)


def _batch(points: Iterable[Point]) -> list[bytes]:
    """:func:`encode_many`, with the caches as they are."""
    templated: list = []  # the points that a template writes,
    templates: list = []  # ... their templates,
    values: list = []  # ... filled with these values (numbers; 0 where a text goes)
    texts: list = []  # ... and these texts: (index in values, bytes), for strings and times
    others: list = []  # (index in the output, line) of the points the general path writes
    cached, last_time, time_text = _lines.get, None, b""
    # points of one series in a row (the task stream's) share their tags dict: their series is looked up once
    last = (None,) * 5  # (measurement, tags, field keys, value types, entry) of the point before
    for point in points:  # the sampler's hottest loop: _series, inlined
        measurement, tags, fields, time_ns = point
        names, kinds = tuple(fields), (*map(type, fields.values()), type(time_ns))
        if tags is last[1] and names == last[2] and kinds == last[3] and measurement == last[0]:
            entry = last[4]
        else:
            try:
                entry = cached((measurement, len(tags), *tags, *tags.values(), *names, *kinds), _NEW)
            except TypeError:  # unhashable names or values: the general path
                entry = None
            if entry is _NEW:
                entry = _series(point)
            last = (measurement, tags, names, kinds, entry)
        if entry is None:
            line = _general(point)
            if line is not None:
                others.append((len(templated) + len(others), line))
            continue
        template, strings = entry
        if strings:  # their texts go in as they are; a 0 holds their place among the numbers
            row, at = [*fields.values()], len(values)
            for i in strings:
                texts.append((at + i, _string(row[i]).encode("utf-8", "replace")))
                row[i] = 0
            values += row
        else:
            values += fields.values()
        if time_ns is not None:
            if time_ns != last_time:  # (a sample's points share their time)
                last_time, time_text = time_ns, b"%d" % time_ns
            texts.append((len(values), time_text))
            values.append(0)
        templates.append(template)
        templated.append(point)
    lines = _fill(templates, values, texts) if templated else []
    if lines is None:  # a value that may not be writable: point by point, only those take the general path
        lines = (
            [_general(p) for p in templated]
            if len(templated) == 1
            else [line for p in templated for line in (_batch([p]) or [None])]
        )
    for i, line in others:
        lines.insert(i, line)
    return lines if None not in lines else [line for line in lines if line is not None]


def _fill(templates: list, values: list, texts: list) -> Optional[list]:
    """The lines these templates write, or None if a value may not be writable."""
    try:  # ints beyond +-(2**53 - 1) raise, so that the general path checks them against int64
        text = orjson.dumps(values, option=orjson.OPT_STRICT_INTEGER)
    except TypeError:
        return None
    if b"null" in text:  # NaN or inf
        return None
    args = text[1:-1].split(b",")
    for i, value in texts:
        if b"\n" in value:  # (a raw newline in a string would split the lines below)
            return None
        args[i] = value
    return (b"\n".join(templates) % tuple(args)).split(b"\n")


def tags_as_fields(point: Point, names) -> Point:
    """``point`` with its tags ``names`` written as string fields instead (setting ``dag-tag: false``:
    ``dag`` leaves the series key, so new DAGs add no series).

    >>> tags_as_fields(Point("gpu", {"job": "1", "dag": "2"}, {"utilization_gpu": 5.0}, 1), ("dag",))
    Point(measurement='gpu', tags={'job': '1'}, fields={'utilization_gpu': 5.0, 'dag': '2'}, time_ns=1)
    """
    moved = {n: point.tags[n] for n in names if n in point.tags}
    if not moved:
        return point
    tags = {k: v for k, v in point.tags.items() if k not in moved}
    return point._replace(tags=tags, fields={**point.fields, **moved})
