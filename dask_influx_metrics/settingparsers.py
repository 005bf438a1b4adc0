"""The parsers behind :data:`.configtable.SETTINGS`: a value as read from dask.config -> its Python value.

Each raises ``ValueError`` saying what the value must be; :mod:`.config` adds the
setting's key and the value to the message.

>>> parse_address("127.0.0.1:8094")
('127.0.0.1', 8094)
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Callable
from urllib.parse import urlsplit

from . import schema

SINKS = ("udp", "http", "spool")
AUTO = "auto"  # sink: udp if telegraf.address is configured, else http if influxdb.url is, else spool
TELEGRAF_FALLBACK = ("127.0.0.1", 8094)  # telegraf.address when not configured
INFLUXDB_FALLBACK = "http://127.0.0.1:8086"  # influxdb.url when not configured
GPU_SOURCES = ("auto", "nvml", "simulated", "none")
GPU_DEVICES = ("auto", "first", "all")  # see sampling/sources/nvml_devices.choose
SAMPLER_MODES = ("agent", "thread")
JOB_TYPES = ("client", "manual")
MAX_GPUS = 64  # the most (simulated) devices per worker
# ms: sampling less often than once a minute misses the peaks this package exists for; larger is a typo
MAX_POLLING_INTERVAL = 60_000


def parse_address(value) -> tuple[str, int]:
    """Parse ``host:port`` (``[v6]:port`` for IPv6) into ``(host, port)``.

    >>> parse_address("127.0.0.1:8094")
    ('127.0.0.1', 8094)
    """
    text = str(value).strip()
    if text.startswith("udp://"):
        text = text[len("udp://") :]
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be host:port with a port from 1 to 65535, e.g. 127.0.0.1:8094; cannot parse {value!r}")
    return host, int(port)


# --- parsers: value as read from dask.config -> Python value, or ValueError("must be ...") ----------
def as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def number(what: str, minimum: float = 0.0, maximum: float = math.inf, integer: bool = False) -> Callable:
    """A parser for a finite number > 0 in [minimum, maximum]; numeric text is read as a number."""

    def parse(value):
        number = value
        if isinstance(value, str):
            try:
                number = float(value) if not value.strip().isdigit() else int(value)
            except ValueError:
                pass
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float))
            or not math.isfinite(number)
            or not (number > 0 and minimum <= number <= maximum)
            or integer
            and number != int(number)
        ):
            raise ValueError(f"must be {what}")
        return int(number) if integer else number

    return parse


positive_int = number("a positive integer", integer=True)
_datagram_bytes = number("'auto' or a number of bytes from 1 to 65507", maximum=65507, integer=True)


_port = number("null (off) or a TCP port from 1 to 65535", maximum=65535, integer=True)


def optional_port(value) -> int | None:
    """A TCP port, or None (null, "", "off", "none": off)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none", "off")):
        return None
    return _port(value)


def max_datagram(value):
    """``auto`` (None: 65507 bytes when Telegraf is on loopback, else 1472) or a size in bytes."""
    return None if value in (AUTO, None) else _datagram_bytes(value)


_positive_seconds = number("a positive, finite number of seconds")


def seconds(value) -> float:
    return float(_positive_seconds(value))


def choice(options: tuple, null=None) -> Callable:
    """A parser for one of ``options``; with ``null``, YAML/environment ``none``/``null``/``off``/``false``
    (which Dask and YAML read as None or False) mean ``null``."""

    def parse(value):
        if null is not None and (value is None or value is False):
            return null
        if value not in options:
            raise ValueError(f"must be one of {options}")
        return value

    return parse


def sinks(value) -> tuple:
    sinks = as_list(value)
    if not sinks or set(sinks) - {*SINKS, AUTO}:
        raise ValueError(f"must be {AUTO!r} or name one or more of {SINKS}")
    return tuple(dict.fromkeys(sinks))


def optional_address(value):
    return None if value is None else parse_address(value)


def auto_sinks(sinks: tuple, configured) -> tuple:
    """Replace ``auto`` in ``sinks``: ``udp`` if ``telegraf.address`` is configured, else ``http``
    if ``influxdb.url`` is, else ``spool``; explicitly named sinks stay.

    >>> auto_sinks(("auto",), ("influxdb.url",))
    ('http',)
    """
    if AUTO not in sinks:
        return sinks
    choice = "udp" if "telegraf.address" in configured else "http" if "influxdb.url" in configured else "spool"
    return tuple(dict.fromkeys(choice if s == AUTO else s for s in sinks))


def tracking(value) -> tuple:
    tracking = as_list(value) or list(schema.TRACKING)
    try:
        schema.fields_for(tracking)
    except ValueError as e:
        raise ValueError(f"must name known metrics: {e}") from None
    return tuple(tracking)


MAX_TAG_BYTES = 1024
# Tag names a user tag may not take: the schema's tags and field names (queries could not tell
# them apart), InfluxQL's ``time``; names starting with ``_`` are InfluxDB 2's (``_start``, ...).
RESERVED_TAGS = frozenset(schema.TAGS) | {name for _, name in schema.FIELDS} | {"time"}
TAGS_ENV = "DASK_INFLUX_METRICS__TAGS"


def _tag_text(what: str, text) -> str:
    """``text`` (a tag key or value) as stored, or ValueError naming ``what`` and the problem."""
    if text is None or text == "":
        raise ValueError(f"{what} is empty; InfluxDB drops empty tags")
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"{what} must be a str or a number, not {type(text).__name__}")
    text = str(text)
    size = len(text.encode())
    if size > MAX_TAG_BYTES:
        raise ValueError(f"{what} has {size} bytes; at most {MAX_TAG_BYTES} are allowed")
    if text.endswith("\\"):
        raise ValueError(f"{what} ends in a backslash, which InfluxDB 1.x cannot store")
    bad = sorted({c for c in text if ord(c) < 0x20 or ord(c) == 0x7F})
    if bad:  # line protocol stores them as spaces: reads filtering on the tag would find nothing
        raise ValueError(
            f"{what} contains control character(s) {', '.join(repr(c) for c in bad)}; "
            "line protocol stores them as spaces, so the value could not be read back"
        )
    return text


def tags(value) -> dict:
    """Extra tags: a mapping of non-empty, short, unreserved names to non-empty, short values."""
    if not isinstance(value or {}, dict):
        raise ValueError("must be a mapping of tag names to values, e.g. {cluster: prod-a}")
    tags = {}
    for key, val in (value or {}).items():
        if key == "" or key is None:
            raise ValueError("has an empty tag key")
        key = _tag_text(f"tag key {str(key)[:40]!r}", key)
        if key in RESERVED_TAGS or key.startswith("_"):
            raise ValueError(
                f"tag {key!r} is reserved (the schema's tags and fields, 'time', names starting "
                f"with '_'); reserved: {sorted(RESERVED_TAGS)}"
            )
        tags[key] = _tag_text(f"the value of tag {key!r}", val)
    return tags


def check_tags_env() -> None:
    """Dask drops a ``DASK_INFLUX_METRICS__TAGS`` that is not a mapping; refuse it instead."""
    import dask.config  # here: the host agent imports this module, and never Dask

    text = os.environ.get(TAGS_ENV)
    if text is not None and not isinstance(dask.config.interpret_value(text), (dict, type(None))):  # none: no tags
        raise ValueError(
            f"{TAGS_ENV} must be a Python dict literal such as {{'cluster': 'prod-a'}} (or set one "
            f"tag per variable: {TAGS_ENV}__CLUSTER=prod-a); cannot parse {text!r}"
        )


def url(value) -> str:
    """An ``http(s)://host...`` URL without the trailing slash; null or empty means none."""
    text = str(value or "").strip().rstrip("/")
    parts = urlsplit(text)
    if text and (parts.scheme not in ("http", "https") or not parts.hostname):
        raise ValueError("must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8086")
    return text


def text(value) -> str:
    if value is None or str(value) == "":
        raise ValueError("must be a non-empty string")
    return str(value)


def optional_text(value) -> str | None:
    return None if value is None else str(value)


MAX_RUN_DIRECTORY = (
    40  # the agent's socket is <run.directory>/dask-influx-metrics-<uid>/<session>/agent.sock: 107 at most
)


def run_directory(value) -> str | None:
    """A folder path short enough for the Unix socket made inside it, or null (the default).

    >>> run_directory("/mnt/shm"), run_directory(None)
    ('/mnt/shm', None)
    """
    if value is None:
        return None
    text = str(value)
    if not text or len(text.encode()) > MAX_RUN_DIRECTORY:
        raise ValueError(f"must be a folder path of 1 to {MAX_RUN_DIRECTORY} bytes (a Unix socket is made inside it)")
    return text


def default_spool_directory() -> str:
    """This OS user's own spool root, ``<tmp>/dask-influx-metrics-<uid>`` (created 0700 when used)."""
    return os.path.join(tempfile.gettempdir(), f"dask-influx-metrics-{os.getuid()}")


def directory(value) -> str:
    return str(value or default_spool_directory())


def boolean(value) -> bool:
    """``true``/``false`` (also from environment variables, as text); null is false."""
    text = str(value).strip().lower()
    if value is None or text in ("false", "0", "no", "off"):
        return False
    if text in ("true", "1", "yes", "on"):
        return True
    raise ValueError("must be true or false")
