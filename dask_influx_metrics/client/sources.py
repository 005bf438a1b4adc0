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


def pick(destinations) -> tuple[str, dict | None]:
    """``("spool", None)``, ``("influxdb", {url, database, retention_policy} or None: the reader's own)``,
    ``("cluster", None)`` (spool not visible here) or ``("unknown", None)`` (no worker reported)."""
    destinations = list(destinations)
    spooling = [d for d in destinations if "spool" in d["sinks"]]
    here = socket.gethostname()
    visible = spooling and all(
        os.path.isdir(d["spool"]) or (d.get("host") == here and os.path.isdir(os.path.dirname(d["spool"])))
        for d in spooling)
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
