"""Where a sender's samples go: its spool folder, the ``undelivered/`` and ``refused/`` folders an HTTP sink
keeps beside it, and the destinations it records on the session (what readers look up).

The layout, under the spool root: ``<session>/<role>/`` (``role``: ``agent-<host>``, a worker address in
thread mode, or ``scheduler``), with ``undelivered/`` (what an HTTP sink could not deliver: an outage) and
``refused/`` (what InfluxDB refused as data, with :data:`REASONS_FILE`) below it.
"""

from __future__ import annotations

import os

from .spool import spool_files

UNDELIVERED_DIR = "undelivered"  # <role>/undelivered: what an HTTP sink could not deliver (an outage)
REFUSED_DIR = "refused"  # <role>/refused: what InfluxDB refused as data
REASONS_FILE = "reasons.txt"  # <role>/refused/reasons.txt: InfluxDB's reason for each refusal, one a line


def safe_name(text: str) -> str:
    """A file-system safe name for a worker address or name.

    >>> safe_name("tcp://127.0.0.1:4012")
    'tcp-127.0.0.1-4012'
    """
    out = "".join(c if c.isalnum() or c in "._" else "-" for c in str(text))
    return "-".join(p for p in out.split("-") if p) or "unnamed"


def spool_dir(settings, session: str, role: str) -> str:
    """Where ``role`` (a worker address, ``agent-<host>`` or ``scheduler``) spools for ``session``."""
    return os.path.join(settings.spool_directory, session, safe_name(role))


def pending_folders(folder) -> list[str]:
    """Every ``undelivered/`` and ``refused/`` folder under ``folder`` that holds spool files.

    >>> pending_folders("/nonexistent")
    []
    """
    return sorted(
        root
        for root, _, _ in os.walk(os.fspath(folder))
        if os.path.basename(root) in (UNDELIVERED_DIR, REFUSED_DIR) and spool_files(root)
    )


def destinations(settings, session: str, role: str) -> dict:
    """Where ``role``'s samples go, as recorded on the scheduler (never credentials).

    ``sinks``; ``telegraf`` (host:port) with udp; ``influxdb`` (``url``, ``database``,
    ``retention_policy``) with http, or with udp when ``influxdb.url`` is configured (the
    InfluxDB Telegraf is assumed to feed); ``spool``: the folder (with http, its ``undelivered`` fallback);
    ``refused``: with http, the folder of the lines InfluxDB refused (and why);
    ``temporary``: the spool root is the default one (``Monitor.shutdown()`` deletes such files).

    >>> from dask_influx_metrics.config import Settings
    >>> destinations(Settings.resolve({"sink": "udp", "telegraf.address": "t:1"}), "s1", "w")["telegraf"]
    't:1'
    """
    out = {
        "sinks": list(settings.sinks),
        "telegraf": None,
        "influxdb": None,
        "spool": None,
        "temporary": "spool.directory" not in settings.configured,
    }
    if "udp" in settings.sinks:
        out["telegraf"] = "%s:%d" % settings.telegraf_address
    if "http" in settings.sinks or ("udp" in settings.sinks and "influxdb.url" in settings.configured):
        out["influxdb"] = {
            "url": settings.influxdb_url,
            "database": settings.database,
            "retention_policy": settings.retention_policy,
        }
    if "spool" in settings.sinks:
        out["spool"] = spool_dir(settings, session, role)
    elif "http" in settings.sinks:
        out["spool"] = os.path.join(spool_dir(settings, session, role), UNDELIVERED_DIR)
    if "http" in settings.sinks:
        out["refused"] = os.path.join(spool_dir(settings, session, role), REFUSED_DIR)
    return out
