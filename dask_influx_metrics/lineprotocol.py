r"""InfluxDB line protocol: ``encode`` a :class:`~.schema.Point`, ``parse`` it back.

One point is one line, ``measurement[,tag=value...] field=value[,...] [time_ns]``,
UTF-8, tags sorted by key. Field values: ``float`` -> shortest text that
round-trips (``repr``), ``int`` -> ``<n>i``, ``bool`` -> ``true``/``false``,
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
several physical lines; use :func:`split_lines` to read a stream back.

Field values that cannot be written are dropped, and the point only if no
field is left: NaN/+-inf floats, ints outside int64 and values of other types
(``None`` is skipped silently). Lone surrogates, which UTF-8 cannot encode,
become ``?``. Each drop is counted in the module-level :data:`stats`.

Known differences between parsers for lines this module writes: Telegraf's
``influx`` parser unescapes ``\"`` in tag keys/values (1.x and v2 keep the
backslash), so a tag containing backslash-quote loses that backslash on the
Telegraf path; InfluxDB 2.x rejects tag keys ``_field`` and ``_measurement``
(1.x accepts them), which this module does not rewrite.

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

from .lineparse import parse, split_lines  # noqa: F401  (the inverse, also importable from here)
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
_STRING_ESC = str.maketrans({"\\": "\\\\", '"': '\\"'})
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
    """A string field's text between its quotes."""
    return _STRING_CR_FF.sub(" ", value).translate(_STRING_ESC)


def _field_value(value) -> Optional[str]:
    kind = type(value)
    if kind is float:
        if value - value == 0.0:  # finite (NaN and inf give NaN)
            return repr(value)
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
            return repr(number)
        stats["nonfinite"] += 1
        return None
    stats["unsupported_type"] += 1
    return None


def _key_ok(key: str, seen) -> bool:
    reason = "empty_key" if not key else "reserved_key" if key in _RESERVED else (
        "duplicate_key" if key in seen else None)
    if reason:
        stats[reason] += 1
    return reason is None


# Samples repeat the same series every interval: escaping each distinct
# ``measurement,tags `` prefix and field key once makes encoding several times
# cheaper. Bounded: cleared when full. Drops of tags are counted in ``stats``
# once per distinct prefix.
_CACHE_LIMIT = 4096
_prefixes: dict = {}
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
    if len(_prefixes) >= _CACHE_LIMIT:
        _prefixes.clear()
    _prefixes[cache_key] = result = _build_prefix(measurement, tags)
    return result


def _build_prefix(measurement, tags) -> Optional[str]:
    name = _measurement(measurement)
    if not name:
        return None
    clean: dict[str, str] = {}
    for key, value in sorted(((str(k), v) for k, v in tags.items()), key=lambda kv: kv[0]):
        value = "" if value is None else _clean(value, _TRAILING_BS)
        if not value:
            continue  # line protocol cannot hold an empty tag value
        key = _clean(key, _TRAILING_BS)
        if _key_ok(key, clean):
            clean[key] = value
    return "".join([name] + [f",{k.translate(_KEY_ESC)}={clean[k].translate(_KEY_ESC)}" for k in sorted(clean)]) + " "


def _field_key(key) -> tuple[str, str]:
    """(cleaned key, escaped key), cached."""
    try:
        return _field_keys[key]
    except KeyError:
        pass
    except TypeError:
        key = str(key)
    clean = _clean(key, _BS_BEFORE_SPECIAL)
    if len(_field_keys) >= _CACHE_LIMIT:
        _field_keys.clear()
    _field_keys[key] = result = (clean, clean.translate(_KEY_ESC))
    return result


# The fast path: samples repeat the same field keys with the same value types.
# For keys that all clean up to distinct writable text and values that are all
# exact ``int``/``float``/``str``, one ``str.format`` template per (keys, types)
# writes the fields (strings escaped first); it is used only when every value is
# writable (finite floats, ints in int64), otherwise the general path below
# decides, so output and ``stats`` are the same either way.
_templates: dict = {}
_NUMBER_FORMAT = {float: "{!r}", int: "{}i", str: '"{}"'}  # str: written escaped (``_string``)


def _template(keys: tuple, types: tuple) -> Optional[str]:
    """The format string writing fields ``keys`` of ``types``, or "" when the fast path does not apply."""
    cache_key = (keys, types)
    try:
        return _templates[cache_key]
    except KeyError:
        pass
    except TypeError:
        return ""
    parts, seen = [], set()
    for key, kind in zip(keys, types):
        clean, escaped = _field_key(key)
        if kind not in _NUMBER_FORMAT or not clean or clean in _RESERVED or clean in seen:
            parts = None
            break
        seen.add(clean)
        parts.append(escaped.replace("{", "{{").replace("}", "}}") + "=" + _NUMBER_FORMAT[kind])
    if len(_templates) >= _CACHE_LIMIT:
        _templates.clear()
    _templates[cache_key] = result = ",".join(parts) if parts else ""
    return result


def _fast_fields(fields: dict) -> Optional[str]:
    """The fields' text when all are finite floats, int64 ints or strings under writable keys, else None."""
    values = tuple(fields.values())
    types = tuple(map(type, values))
    template = _template(tuple(fields), types)
    if not template:
        return None
    numbers = values
    if str in types:
        numbers = [v for v in values if type(v) is not str]
        values = tuple(_string(v) if type(v) is str else v for v in values)
        if not numbers:
            return template.format(*values)
    if not _INT64_MIN <= min(numbers) or not max(numbers) <= _INT64_MAX:  # also False for a NaN first
        return None
    total = sum(numbers)  # NaN or inf when any value is (or, rarely, on overflow: then the general path)
    return template.format(*values) if total - total == 0.0 else None


def encode(point: Point) -> Optional[bytes]:
    """One line of line protocol (no newline), or ``None`` if nothing is writable.

    >>> encode(Point("m", {"t": ""}, {"x": float("nan"), "s": 'say "hi"'}, 5))
    b'm s="say \\\\"hi\\\\"" 5'
    >>> encode(Point("m", {}, {"x": float("inf")}, 5)) is None
    True
    """
    prefix = _prefix(point.measurement, point.tags)
    if prefix is None:
        stats["points"] += 1
        return None
    text = _fast_fields(point.fields) if point.fields else None
    if text is not None:
        line = prefix + text if point.time_ns is None else f"{prefix}{text} {int(point.time_ns)}"
        return line.encode("utf-8", "replace")  # only prefix text can hold lone surrogates: "?" as below
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
    return [line for line in map(encode, points) if line is not None]
