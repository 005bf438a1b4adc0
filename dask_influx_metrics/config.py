"""Settings, each declared once (:data:`SETTINGS`), read through Dask's own config system.

One table row per setting gives its config key (below ``influx-metrics``),
the :class:`Settings` attribute, the ``Monitor``/``attach`` keywords, the
default, the parser that validates it, the unit and a line of doc. Everything
else is derived from that table: the defaults registered with ``dask.config``
when the package is imported, the :class:`Settings` fields, :data:`KWARGS`,
the shipped ``influx-metrics.yaml`` (:func:`defaults_yaml`) and the README
settings table (:func:`settings_table_markdown`); ``tests/test_config.py``
checks that the file and the README say what the table says.

Environment variables (``DASK_INFLUX_METRICS__SINK=udp``) and YAML files
override the defaults the usual Dask way. Per-call overrides travel to
workers as a small dict of dotted keys, so every worker still resolves what
is node-local (the Telegraf address, the spool directory) from its own config.

Example
-------
>>> s = Settings.resolve({"polling-interval": 50})
>>> s.polling_interval, s.database
(50, 'dask_metrics')
"""

from __future__ import annotations

import copy
import math
import os
import socket
import tempfile
from dataclasses import field, make_dataclass
from typing import Any, Callable, NamedTuple
from urllib.parse import urlsplit

import dask.config
import yaml

from . import schema

SINKS = ("udp", "http", "spool")
GPU_SOURCES = ("auto", "nvml", "simulated", "none")
GPU_DEVICES = ("auto", "first", "all")  # see worker/sources/nvml_devices.choose
JOB_TYPES = ("client", "manual")
MAX_GPUS = 64  # the most (simulated) devices per worker


def parse_address(value) -> tuple[str, int]:
    """Parse ``host:port`` (``[v6]:port`` for IPv6) into ``(host, port)``.

    >>> parse_address("127.0.0.1:8094")
    ('127.0.0.1', 8094)
    """
    text = str(value).strip()
    if text.startswith("udp://"):
        text = text[len("udp://"):]
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be host:port with a port from 1 to 65535, e.g. 127.0.0.1:8094; cannot parse {value!r}")
    return host, int(port)


# --- parsers: value as read from dask.config -> Python value, or ValueError("must be ...") ----------
def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def _number(what: str, minimum: float = 0.0, maximum: float = math.inf, integer: bool = False) -> Callable:
    """A parser for a finite number > 0 in [minimum, maximum]; numeric text is read as a number."""
    def parse(value):
        number = value
        if isinstance(value, str):
            try:
                number = float(value) if not value.strip().isdigit() else int(value)
            except ValueError:
                pass
        if (isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number)
                or not (number > 0 and minimum <= number <= maximum) or integer and number != int(number)):
            raise ValueError(f"must be {what}")
        return int(number) if integer else number
    return parse


_positive_int = _number("a positive integer", integer=True)
_positive_seconds = _number("a positive, finite number of seconds")


def _seconds(value) -> float:
    return float(_positive_seconds(value))


def _choice(options: tuple) -> Callable:
    def parse(value):
        if value not in options:
            raise ValueError(f"must be one of {options}")
        return value
    return parse


def _sinks(value) -> tuple:
    sinks = _as_list(value)
    if not sinks or set(sinks) - set(SINKS):
        raise ValueError(f"must name one or more of {SINKS}")
    return tuple(dict.fromkeys(sinks))


def _tracking(value) -> tuple:
    tracking = _as_list(value) or list(schema.TRACKING)
    try:
        schema.fields_for(tracking)
    except ValueError as e:
        raise ValueError(f"must name known metrics: {e}") from None
    return tuple(tracking)


def _tags(value) -> dict:
    reserved = schema.COMMON_TAGS + schema.DEVICE_TAGS
    if not isinstance(value or {}, dict) or set(value or {}) & set(reserved):
        raise ValueError(f"must be a mapping that does not redefine {reserved}")
    return {str(k): str(v) for k, v in (value or {}).items()}


def _url(value) -> str:
    """An ``http(s)://host...`` URL without the trailing slash; null or empty means none."""
    text = str(value or "").strip().rstrip("/")
    parts = urlsplit(text)
    if text and (parts.scheme not in ("http", "https") or not parts.hostname):
        raise ValueError("must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8086")
    return text


def _text(value) -> str:
    if value is None or str(value) == "":
        raise ValueError("must be a non-empty string")
    return str(value)


def _optional_text(value) -> str | None:
    return None if value is None else str(value)


def _directory(value) -> str:
    return str(value or os.path.join(tempfile.gettempdir(), "dask-influx-metrics"))


def _bool(value) -> bool:
    """``true``/``false`` (also from environment variables, as text); null is false."""
    text = str(value).strip().lower()
    if value is None or text in ("false", "0", "no", "off"):
        return False
    if text in ("true", "1", "yes", "on"):
        return True
    raise ValueError("must be true or false")


# --- the table -------------------------------------------------------------------------------------
class Setting(NamedTuple):
    """One setting, declared once."""

    key: str                    # below ``influx-metrics``, dotted: "telegraf.address"
    attr: str                   # the Settings attribute
    default: Any                # the YAML default (before parsing)
    parse: Callable             # config value -> Python value; raises ValueError("must be ...")
    unit: str                   # "ms", "s", "bytes", ... or ""
    doc: str                    # one line for the YAML comment and the README
    keywords: tuple = ()        # Monitor/attach keywords; () means (attr,)
    secret: bool = False        # hidden from repr

    @property
    def kwargs(self) -> tuple:
        return self.keywords or (self.attr,)


SETTINGS: tuple[Setting, ...] = (
    Setting("polling-interval", "polling_interval", 200, _number("a number of ms >= 1", minimum=1), "ms",
            "time between samples on each worker"),
    Setting("tracking", "tracking", None, _tracking, "",
            "metric names to collect; null = all (see schema.TRACKING)"),
    Setting("job-type", "job_type", "client", _choice(JOB_TYPES), "",
            "client: each client connection is a job; manual: only new_job() starts one"),
    Setting("sink", "sinks", "spool", _sinks, "",
            "where samples go: udp, http, spool, or a list such as [udp, spool]", keywords=("sink",)),
    Setting("tags", "tags", {}, _tags, "", "extra tags written on every point, e.g. {cluster: prod-a}"),
    Setting("telegraf.address", "telegraf_address", "127.0.0.1:8094", parse_address, "",
            "node-local Telegraf UDP listener (host:port), read on each worker"),
    Setting("telegraf.max-datagram", "max_datagram", 1472, _positive_int, "bytes",
            "largest UDP datagram; 1472 fits a 1500-byte MTU unfragmented"),
    Setting("influxdb.url", "influxdb_url", "http://127.0.0.1:8086", _url, "",
            "InfluxDB for the http sink and for queries (http:// or https://)"),
    Setting("influxdb.database", "database", "dask_metrics", _text, "",
            "1.x database, or the DBRP-mapped database on 2.x"),
    Setting("influxdb.retention-policy", "retention_policy", None, _optional_text, "",
            "retention policy; null = the database's default"),
    Setting("influxdb.username", "username", None, _optional_text, "", "1.x user name"),
    Setting("influxdb.password", "password", None, _optional_text, "", "1.x password", secret=True),
    Setting("influxdb.token", "token", None, _optional_text, "",
            "InfluxDB 2.x/3.x token (sent as 'Authorization: Token ...')", secret=True),
    Setting("influxdb.batch-size", "batch_size", 5000, _positive_int, "lines", "size of one HTTP write"),
    Setting("influxdb.timeout", "http_timeout", 5, _seconds, "s", "time limit per HTTP request"),
    Setting("spool.directory", "spool_directory", None, _directory, "",
            "spool root; null = dask-influx-metrics in the temporary directory",
            keywords=("spool_directory", "dump_loc")),
    Setting("spool.mem-limit", "mem_limit", 1000, _positive_int, "lines",
            "held in worker memory before being appended to disk"),
    Setting("spool.flush-interval", "flush_interval", 1, _seconds, "s",
            "buffered lines reach disk at least this often"),
    Setting("gpu.source", "gpu_source", "auto", _choice(GPU_SOURCES), "",
            "auto (NVML if present, else none), nvml, simulated, none"),
    Setting("gpu.count", "gpu_count", 1, _number(f"an integer from 1 to {MAX_GPUS}", maximum=MAX_GPUS, integer=True),
            "", "simulated devices per worker (gpu.source: simulated)"),
    Setting("gpu.devices", "gpu_devices", "auto", _choice(GPU_DEVICES), "",
            "GPUs a worker reports: first (its own under dask-cuda), all visible, or auto (first when "
            "CUDA_VISIBLE_DEVICES is set, else all)"),
    Setting("sampler.isolate", "isolate", False, _bool, "",
            "true: sample in a sidecar process per worker, outside the worker's GIL (worker/sidecar.py)"),
    Setting("sampler.host-once", "host_once", False, _bool, "",
            "true: one worker per host writes the host measurement (the holder of host.lock; "
            "per-worker tables then show host columns for that worker only)"),
)

_BY_KEY = {s.key: s for s in SETTINGS}

# Keyword arguments accepted by Monitor(...) and Monitor.attach(...), and the
# config key (below ``influx-metrics``) each one overrides.
KWARGS = {kw: s.key for s in SETTINGS for kw in s.kwargs}


def _nested(pairs) -> dict:
    out: dict = {}
    for key, value in pairs:
        *parents, leaf = key.split(".")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = copy.deepcopy(value)
    return out


DEFAULTS = {"influx-metrics": _nested((s.key, s.default) for s in SETTINGS)}
dask.config.update_defaults(DEFAULTS)


def _invalid(key: str, problem, value) -> ValueError:
    return ValueError(f"influx-metrics.{key} {problem}, got {value!r}")


def _parse(setting: Setting, value):
    try:
        return setting.parse(value)
    except ValueError as e:
        raise _invalid(setting.key, e, value) from None


_Fields = make_dataclass("_Fields", [(s.attr, Any, field(repr=not s.secret)) for s in SETTINGS], frozen=True)


class Settings(_Fields):
    """Every setting, resolved and validated; one attribute per :data:`SETTINGS` row.

    Build with :meth:`resolve` (anywhere), :meth:`for_session` (where a
    session is created) or :meth:`from_dict` (settings resolved elsewhere).
    """

    @property
    def fields(self) -> frozenset:
        """The (measurement, field) pairs this tracking list turns on."""
        return schema.fields_for(self.tracking)

    @classmethod
    def resolve(cls, overrides: dict | None = None) -> "Settings":
        """Read ``influx-metrics.*`` from dask.config with ``overrides`` on top, and validate it.

        ``overrides`` maps keys below ``influx-metrics`` (``"sink"``,
        ``"telegraf.address"``) to values; ``None`` means "not given". Raises
        ``ValueError`` naming the offending key and value. No network access.
        """
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        unknown = sorted(k for k in overrides if k.replace("_", "-") not in _BY_KEY)
        if unknown:
            raise ValueError(f"unknown influx-metrics setting(s) {unknown}; known: {sorted(_BY_KEY)}")
        # dask.config.get treats '-' and '_' alike, as environment variables need
        with dask.config.set({f"influx-metrics.{k}": v for k, v in overrides.items()}):
            raw = {s.key: copy.deepcopy(dask.config.get(f"influx-metrics.{s.key}", default=None)) for s in SETTINGS}
        settings = cls(**{s.attr: _parse(s, raw[s.key]) for s in SETTINGS})
        if "http" in settings.sinks and not settings.influxdb_url:
            raise _invalid("influxdb.url", "must be set for the http sink", raw["influxdb.url"])
        return settings

    @classmethod
    def for_session(cls, overrides: dict | None = None) -> "Settings":
        """:meth:`resolve`, then :meth:`check_telegraf_host`: for where a session is created."""
        settings = cls.resolve(overrides)
        settings.check_telegraf_host()
        return settings

    def check_telegraf_host(self) -> None:
        """With the udp sink, raise ``ValueError`` unless the Telegraf host resolves here.

        A DNS lookup, so it can block: run it once where the session is
        created, off any event loop, not on every worker start.
        """
        if "udp" not in self.sinks:
            return
        host, port = self.telegraf_address
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except (OSError, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode
            raise _invalid("telegraf.address", f"names a host that does not resolve ({e})", f"{host}:{port}") from None

    @classmethod
    def from_dict(cls, doc: dict) -> "Settings":
        """Rebuild settings resolved elsewhere and sent as ``dataclasses.asdict`` (JSON lists become tuples).

        No validation: they were validated where they were resolved.
        """
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()})


def overrides_from_kwargs(**kwargs) -> dict:
    """Map Python keyword arguments to ``influx-metrics`` config keys.

    ``None`` means "not given". ``mem_limit``/``dump_loc`` (the old
    dask-metrics spill-to-disk options) also switch the spool sink on.

    >>> overrides_from_kwargs(polling_interval=50, telegraf_address="10.0.0.1:8094")
    {'polling-interval': 50, 'telegraf.address': '10.0.0.1:8094'}
    """
    unknown = sorted(set(kwargs) - set(KWARGS))
    if unknown:
        raise TypeError(f"unknown setting(s) {unknown}; known: {sorted(KWARGS)}")
    out = {KWARGS[k]: v for k, v in kwargs.items() if v is not None}
    if kwargs.get("mem_limit") is not None or kwargs.get("dump_loc") is not None:
        sinks = _as_list(out.get("sink", dask.config.get("influx-metrics.sink")))
        if "spool" not in sinks:
            out["sink"] = sinks + ["spool"]
    return out


# --- documents derived from the table ----------------------------------------------------------------
def _yaml_value(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("...\n").strip()


def _doc(setting: Setting) -> str:
    return f"{setting.doc} ({setting.unit})" if setting.unit else setting.doc


_YAML_HEADER = """\
# Defaults for dask-influx-metrics. Every key can be set with dask.config,
# a YAML file in ~/.config/dask/, or an environment variable such as
# DASK_INFLUX_METRICS__SINK=udp. Monitor(...) and attach(...) override per call.
# Generated from dask_influx_metrics/config.py (SETTINGS) by config.defaults_yaml(); edit it there.
"""


def defaults_yaml() -> str:
    """The text of ``influx-metrics.yaml``: every default with its doc as a comment."""
    lines, section = [_YAML_HEADER + "influx-metrics:"], ""
    for s in SETTINGS:
        parent, _, leaf = s.key.rpartition(".")
        if parent != section:
            lines.append(f"  {parent}:")
            section = parent
        indent = "    " if parent else "  "
        lines.append(f"{indent}{leaf}: {_yaml_value(s.default)}".ljust(31) + f"# {_doc(s)}")
    return "\n".join(lines) + "\n"


def settings_table_markdown() -> str:
    """The README "Settings" table: key (keywords), default, unit, meaning."""
    rows = ["| key (keywords) | default | unit | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        keywords = ", ".join(f"`{k}`" for k in s.kwargs)
        rows.append(f"| `{s.key}` ({keywords}) | `{_yaml_value(s.default)}` | {s.unit} | {s.doc} |")
    return "\n".join(rows) + "\n"
