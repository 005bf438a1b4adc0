"""Settings, each declared once (:data:`.configtable.SETTINGS`), read through Dask's own config system.

One table row per setting gives its config key (below ``influx-metrics``),
the :class:`Settings` attribute, the ``Monitor``/``attach`` keywords, the
default, the parser that validates it, the unit and a line of doc. Everything
else is derived from that table: the defaults registered with ``dask.config``
when the package is imported (:func:`register_defaults`; read from the table where a
reset of dask.config dropped them: :func:`value`), the :class:`Settings` fields, :data:`KWARGS`,
the shipped ``influx-metrics.yaml`` and the docs/settings.md settings table
(:mod:`.configdocs`); ``tests/test_config.py`` checks that the file and
docs/settings.md say what the table says.

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
import dataclasses
import socket
from dataclasses import field, make_dataclass
from typing import Any

from . import credentials, schema, settingparsers
from .configtable import SETTINGS, Setting
from .notices import clip

_BY_KEY = {s.key: s for s in SETTINGS}
RENAMED = {"sampler.isolate": "sampler.mode", "sampler.host-once": "sampler.mode"}  # removed key -> its successor


def _check_renamed(overrides: dict) -> None:
    """A removed setting, from an override, YAML or the environment, is an error naming its successor."""
    import dask.config

    for old, new in RENAMED.items():
        given = old in overrides or old.replace("-", "_") in overrides
        if given or dask.config.get(f"influx-metrics.{old}", default=None) is not None:
            raise ValueError(
                f"influx-metrics.{old} was removed; use influx-metrics.{new} "
                f"(one of {settingparsers.SAMPLER_MODES}: agent, the default, samples once per host)"
            )


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
AGENT_ENV = "INFLUX_METRICS_SAMPLING_AGENT"  # set in the host agent's environment (worker/agentlink.py)
_MISSING = object()


def register_defaults() -> None:
    """Add :data:`DEFAULTS` to dask.config, so that ``dask.config.get("influx-metrics.sink")`` answers: what
    importing the package does, except in the host's sampling agent (:data:`AGENT_ENV` set), which reads no
    Dask config (its settings come resolved) and starts in half the time without importing Dask."""
    import dask.config

    dask.config.update_defaults(DEFAULTS)


def value(key: str):
    """``influx-metrics.<key>`` from dask.config; where the key is missing, its default from :data:`SETTINGS`
    (never None for a key whose default is not). A program or a test suite that puts back a copy of
    dask.config taken before this package was imported drops the defaults registered above.

    >>> import dask
    >>> with dask.config.set({"influx-metrics": {}}):
    ...     value("polling-interval"), value("sink")
    (200, 'auto')
    """
    import dask.config

    got = dask.config.get(f"influx-metrics.{key}", default=_MISSING)
    return copy.deepcopy(_BY_KEY[key].default if got is _MISSING else got)


def _invalid(key: str, problem, value) -> ValueError:
    return ValueError(f"influx-metrics.{key} {problem}, got {clip(repr(value))}")


def _parse(setting: Setting, value):
    try:
        return setting.parse(value)
    except ValueError as e:
        raise _invalid(setting.key, e, value) from None


_FALLBACKS = {"telegraf_address": settingparsers.TELEGRAF_FALLBACK, "influxdb_url": settingparsers.INFLUXDB_FALLBACK}
_Fields = make_dataclass(
    "_Fields",
    [(s.attr, Any, field(repr=not s.secret)) for s in SETTINGS]
    + [("configured", tuple, field(default=(), repr=False))],
    frozen=True,
)


class Settings(_Fields):
    """Every setting, resolved and validated; one attribute per :data:`SETTINGS` row.

    Build with :meth:`resolve` (anywhere), :meth:`for_session` (where a
    session is created) or :meth:`from_dict` (settings resolved elsewhere).
    """

    def __repr__(self) -> str:  # secrets are left out; a user:password@ URL shows its password masked
        return credentials.mask(super().__repr__(), credentials.split_url(str(self.influxdb_url or ""))[2])

    @property
    def fields(self) -> frozenset:
        """The (measurement, field) pairs this tracking list turns on."""
        return schema.fields_for(self.tracking)

    @property
    def field_tags(self) -> tuple:
        """The tags written as string fields instead (``dag-tag: false``, ``session-tag: false``).

        >>> Settings.resolve({"dag-tag": False, "session-tag": False}).field_tags
        ('dag', 'session')
        """
        return ("dag",) * (not self.dag_tag) + (schema.SESSION,) * (not self.session_tag)

    @classmethod
    def resolve(cls, overrides: dict | None = None) -> "Settings":
        """Read ``influx-metrics.*`` from dask.config with ``overrides`` on top, and validate it.

        ``overrides`` maps keys below ``influx-metrics`` (``"sink"``,
        ``"telegraf.address"``) to values; ``None`` means "not given". Raises
        ``ValueError`` naming the offending key and value. No network access.
        """
        import dask.config

        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        settingparsers.check_tags_env()
        _check_renamed(overrides)
        unknown = sorted(k for k in overrides if k.replace("_", "-") not in _BY_KEY)
        if unknown:
            raise ValueError(f"unknown influx-metrics setting(s) {unknown}; known: {sorted(_BY_KEY)}")
        # dask.config.get treats '-' and '_' alike, as environment variables need
        with dask.config.set({f"influx-metrics.{k}": v for k, v in overrides.items()}):
            raw = {s.key: value(s.key) for s in SETTINGS}
        values = {s.attr: _parse(s, raw[s.key]) for s in SETTINGS}
        # "configured": set by the user (YAML, environment, override) rather than left at the null default
        configured = tuple(k for k in ("telegraf.address", "influxdb.url", "spool.directory") if raw[k] is not None)
        values["sinks"] = settingparsers.auto_sinks(values["sinks"], configured)
        for attr, fallback in _FALLBACKS.items():
            if values[attr] is None or (attr == "influxdb_url" and raw["influxdb.url"] is None):
                values[attr] = fallback
        settings = cls(**values, configured=configured)
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


def public(settings: Settings) -> dict:
    """``settings`` as plain data without the secret ones (to compare or record; never credentials)."""
    secret = {s.attr for s in SETTINGS if s.secret} | {"username"}
    return {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings).items() if k not in secret
    }


def overrides_from_kwargs(**kwargs) -> dict:
    """Map Python keyword arguments to ``influx-metrics`` config keys.

    ``None`` means "not given". ``mem_limit``/``dump_loc`` (the old
    dask-metrics spill-to-disk options) also switch the spool sink on.

    >>> overrides_from_kwargs(polling_interval=50, telegraf_address="10.0.0.1:8094")
    {'polling-interval': 50, 'telegraf.address': '10.0.0.1:8094'}
    """
    unknown = sorted(set(kwargs) - set(KWARGS))
    removed = [k for k in unknown if k in ("isolate", "host_once")]
    if removed:
        raise TypeError(
            f"the setting(s) {removed} were removed; use sampler_mode='agent' (the default: one "
            "sampling agent per host) or sampler_mode='thread' (each worker samples itself)"
        )
    if unknown:
        raise TypeError(f"unknown setting(s) {unknown}; known: {sorted(KWARGS)}")
    out = {KWARGS[k]: v for k, v in kwargs.items() if v is not None}
    if kwargs.get("mem_limit") is not None or kwargs.get("dump_loc") is not None:
        sinks = settingparsers.as_list(out.get("sink", value("sink")))  # "auto" stays, beside spool
        if "spool" not in sinks:
            out["sink"] = sinks + ["spool"]
    return out
