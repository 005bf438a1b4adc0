"""Where a session's samples are read from: where its workers reported sending them.

Each worker (and the scheduler, for its ``dag`` points) records its destinations
on the session (:func:`~dask_influx_metrics.sinks.destinations`). A reader
picks, in order:

1. the spool, when every spooling worker's folder is visible here (exact, nothing in flight);
2. the InfluxDB a worker wrote to (http) or named (udp with ``influxdb.url`` configured);
3. with udp only, the InfluxDB of the reader's own ``influxdb.url``/``database``;
4. the spool through the cluster (:mod:`.clusterspool`), folders this machine cannot see.

Credentials always come from the reader's own settings, never from the workers.

>>> pick([{"sinks": ["udp"], "telegraf": "t:8094", "influxdb": None, "spool": None}])
('influxdb', None)
"""

from __future__ import annotations

import os
import socket
from typing import NamedTuple

CLUSTER = "cluster"  # read the workers' spool through the cluster (:mod:`.clusterspool`)


class Where(NamedTuple):
    """Where a reader reads a session: ``connect(*args, **options)`` (``args == (CLUSTER,)``: through the cluster)."""

    args: tuple
    options: dict


def resolve(destinations: dict, session: str, reader) -> Where:
    """Where to read session ``session`` whose senders reported ``destinations`` (sender -> where), with the
    reader's own settings ``reader`` (credentials, and its sinks where no worker reported). A value: nothing
    of the caller's is changed."""
    kind, influxdb = pick(destinations.values())
    spool = os.path.join(reader.spool_directory, session)
    if kind == "unknown":  # no worker reported: its sinks are those of this reader's settings
        if "spool" in reader.sinks and os.path.isdir(spool):
            return Where((spool,), {})
        kind = "influxdb" if {"udp", "http"} & set(reader.sinks) else CLUSTER
    if kind == "spool":
        return Where((spool_session_folder(destinations.values()),), {})
    if kind != "influxdb":
        return Where((CLUSTER,), {})
    influxdb = influxdb or {"url": reader.influxdb_url, "database": reader.database, "retention_policy": None}
    options = {
        "retention_policy": influxdb["retention_policy"] or reader.retention_policy,
        "username": reader.username,
        "password": reader.password,
        "token": reader.token,
    }
    if os.path.isdir(spool):  # samples an HTTP sink kept on disk: named in the notes
        options["undelivered"] = spool
    return Where((influxdb["url"], influxdb["database"]), options)


def pick(destinations) -> tuple[str, dict | None]:
    """``("spool", None)``, ``("influxdb", {url, database, retention_policy} or None: the reader's own)``,
    ``("cluster", None)`` (spool not visible here) or ``("unknown", None)`` (no worker reported)."""
    destinations = list(destinations)
    spooling = [d for d in destinations if "spool" in d["sinks"]]
    here = socket.gethostname()
    visible = spooling and all(
        os.path.isdir(d["spool"]) or (d.get("host") == here and os.path.isdir(os.path.dirname(d["spool"])))
        for d in spooling
    )
    if visible:
        return "spool", None
    named = [d["influxdb"] for d in destinations if d.get("influxdb")]
    if named:
        return "influxdb", named[0]
    if any("udp" in d["sinks"] for d in destinations):
        return "influxdb", None
    return ("cluster", None) if spooling else ("unknown", None)


def spool_session_folder(destinations) -> str:
    """The session folder the spooling workers share (the first, if their spool roots differ)."""
    return sorted(os.path.dirname(d["spool"]) for d in destinations if "spool" in d["sinks"])[0]


def unreachable(error, destinations: dict, configured) -> str:
    """The message of a reader that cannot reach InfluxDB (``error``): where the workers sent the
    samples, and where an HTTP sink's undelivered copy is and how to read or replay it. ``configured``:
    the reader's settings set by the user (``Settings.configured``)."""
    workers = {w: d for w, d in destinations.items() if w != "scheduler"}
    message = str(error)
    udp = sorted({d["telegraf"] for d in workers.values() if "udp" in d["sinks"] and d.get("telegraf")})
    if udp and not any(d.get("influxdb") for d in workers.values()) and "influxdb.url" not in configured:
        message = (
            f"cannot read the samples back: the workers sent them over UDP to Telegraf at {', '.join(udp)}, "
            "and this reader has no influxdb.url configured (the default tried: "
            f"{message.removeprefix('cannot reach InfluxDB at ')}); set influx-metrics.influxdb.url to the "
            "InfluxDB that Telegraf writes to, or pass query(source='http://host:8086')"
        )
    undelivered = sorted({d["spool"] for d in workers.values() if "http" in d["sinks"] and d.get("spool")})
    if undelivered:
        folder = os.path.dirname(os.path.dirname(undelivered[0]))  # <root>/<session>
        here = os.path.isdir(folder)
        message += (
            f". The samples InfluxDB did not take are kept under {folder}/<sender>/undelivered/ (the host's "
            "agent-<host>/ and each worker's own folder)"
            + (
                f": read them with monitor.query(source={folder!r}) or `dask-influx-metrics jobs --source "
                f"{folder}`; once InfluxDB is back, write them into it with "
                f"`dask-influx-metrics replay {folder} --source <url>`"
                if here
                else " on the workers' hosts: read them through the cluster with monitor.query(source='cluster')"
            )
        )
    return message
