"""Settings, in one place, through Dask's own config system.

Defaults live in ``influx-metrics.yaml`` beside this file and are registered
under the ``influx-metrics`` key when the package is imported; environment
variables (``DASK_INFLUX_METRICS__SINK=udp``) and YAML files override them the
usual Dask way. Per-call overrides travel to workers as a small dict of dotted
keys, so every worker still resolves what is node-local (the Telegraf address,
the spool directory) from its own config.

Example
-------
>>> s = Settings.resolve({"polling-interval": 50})
>>> s.polling_interval, s.database
(50, 'dask_metrics')
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass, field

import dask.config
import yaml

from . import schema

_DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "influx-metrics.yaml")
with open(_DEFAULTS_FILE) as _f:
    DEFAULTS = yaml.safe_load(_f)
dask.config.update_defaults(DEFAULTS)

SINKS = ("udp", "http", "spool")
GPU_SOURCES = ("auto", "nvml", "simulated", "none")
JOB_TYPES = ("client", "manual")


def parse_address(value, what="influx-metrics.telegraf.address") -> tuple[str, int]:
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
        raise ValueError(f"{what}: cannot parse {value!r}; expected host:port, e.g. 127.0.0.1:8094")
    return host, int(port)


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


@dataclass(frozen=True)
class Settings:
    """Every setting, resolved and validated. Build with :meth:`resolve`."""

    polling_interval: int
    tracking: tuple[str, ...]
    job_type: str
    sinks: tuple[str, ...]
    tags: dict = field(default_factory=dict)
    telegraf_address: tuple[str, int] = ("127.0.0.1", 8094)
    max_datagram: int = 1472
    influxdb_url: str = ""
    database: str = "dask_metrics"
    retention_policy: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    batch_size: int = 5000
    http_timeout: float = 5.0
    spool_directory: str = ""
    mem_limit: int = 1000
    flush_interval: float = 1.0
    gpu_source: str = "auto"
    gpu_count: int = 1
    isolate: bool = False  # sampler.isolate: sample in a sidecar process (see worker/sidecar.py)

    @property
    def fields(self) -> frozenset:
        """The (measurement, field) pairs this tracking list turns on."""
        return schema.fields_for(self.tracking)

    @classmethod
    def resolve(cls, overrides: dict | None = None) -> "Settings":
        """Read ``influx-metrics.*`` from dask.config with ``overrides`` on top.

        ``overrides`` maps keys below ``influx-metrics`` (``"sink"``,
        ``"telegraf.address"``) to values. Raises ``ValueError`` naming the
        offending key for anything invalid.
        """
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        paths = ("polling-interval", "tracking", "job-type", "sink", "tags", "telegraf.address",
                 "telegraf.max-datagram", "influxdb.url", "influxdb.database", "influxdb.retention-policy",
                 "influxdb.username", "influxdb.password", "influxdb.token", "influxdb.batch-size",
                 "influxdb.timeout", "spool.directory", "spool.mem-limit", "spool.flush-interval",
                 "gpu.source", "gpu.count", "sampler.isolate")
        # dask.config.get treats '-' and '_' alike, as environment variables need
        with dask.config.set({f"influx-metrics.{k}": v for k, v in overrides.items()}):
            values = {p: copy.deepcopy(dask.config.get(f"influx-metrics.{p}", default=None)) for p in paths}
        get = values.__getitem__

        interval = get("polling-interval")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
            raise ValueError(f"influx-metrics.polling-interval must be a positive number of ms, got {interval!r}")
        tracking = _as_list(get("tracking")) or list(schema.TRACKING)
        schema.fields_for(tracking)  # raises on unknown names
        job_type = get("job-type")
        if job_type not in JOB_TYPES:
            raise ValueError(f"influx-metrics.job-type must be one of {JOB_TYPES}, got {job_type!r}")
        sinks = _as_list(get("sink"))
        bad = [s for s in sinks if s not in SINKS]
        if not sinks or bad:
            raise ValueError(f"influx-metrics.sink must name one or more of {SINKS}, got {get('sink')!r}")
        source = get("gpu.source")
        if source not in GPU_SOURCES:
            raise ValueError(f"influx-metrics.gpu.source must be one of {GPU_SOURCES}, got {source!r}")
        tags = get("tags") or {}
        if not isinstance(tags, dict) or set(tags) & set(schema.COMMON_TAGS + schema.DEVICE_TAGS):
            raise ValueError(f"influx-metrics.tags must be a mapping that does not redefine {schema.COMMON_TAGS + schema.DEVICE_TAGS}, got {tags!r}")
        return cls(
            polling_interval=interval,
            tracking=tuple(tracking),
            job_type=job_type,
            sinks=tuple(dict.fromkeys(sinks)),
            tags={str(k): str(v) for k, v in tags.items()},
            telegraf_address=parse_address(get("telegraf.address")),
            max_datagram=_positive_int(get("telegraf.max-datagram"), "telegraf.max-datagram"),
            influxdb_url=str(get("influxdb.url") or "").rstrip("/"),
            database=str(get("influxdb.database")),
            retention_policy=get("influxdb.retention-policy"),
            username=get("influxdb.username"),
            password=get("influxdb.password"),
            token=get("influxdb.token"),
            batch_size=_positive_int(get("influxdb.batch-size"), "influxdb.batch-size"),
            http_timeout=float(get("influxdb.timeout")),
            spool_directory=str(get("spool.directory") or os.path.join(tempfile.gettempdir(), "dask-influx-metrics")),
            mem_limit=_positive_int(get("spool.mem-limit"), "spool.mem-limit"),
            flush_interval=float(get("spool.flush-interval")),
            gpu_source=source,
            gpu_count=_positive_int(get("gpu.count"), "gpu.count"),
            isolate=_as_bool(get("sampler.isolate"), "sampler.isolate"),
        )


def _positive_int(value, key) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number <= 0 or number != value and not str(value).isdigit():
        raise ValueError(f"influx-metrics.{key} must be a positive integer, got {value!r}")
    return number


def _as_bool(value, key) -> bool:
    """``true``/``false`` (also from environment variables, as text); null is false."""
    text = str(value).strip().lower()
    if value is None or text in ("false", "0", "no", "off"):
        return False
    if text in ("true", "1", "yes", "on"):
        return True
    raise ValueError(f"influx-metrics.{key} must be true or false, got {value!r}")


# Keyword arguments accepted by Monitor(...) and Monitor.attach(...), and the
# config key (below ``influx-metrics``) each one overrides.
KWARGS = {
    "polling_interval": "polling-interval",
    "tracking": "tracking",
    "job_type": "job-type",
    "sink": "sink",
    "tags": "tags",
    "telegraf_address": "telegraf.address",
    "max_datagram": "telegraf.max-datagram",
    "influxdb_url": "influxdb.url",
    "database": "influxdb.database",
    "retention_policy": "influxdb.retention-policy",
    "username": "influxdb.username",
    "password": "influxdb.password",
    "token": "influxdb.token",
    "spool_directory": "spool.directory",
    "dump_loc": "spool.directory",
    "mem_limit": "spool.mem-limit",
    "flush_interval": "spool.flush-interval",
    "gpu_source": "gpu.source",
    "gpu_count": "gpu.count",
    "isolate": "sampler.isolate",
}


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
