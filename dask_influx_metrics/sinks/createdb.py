"""The http sink's ``CREATE DATABASE``: a write answered ``404 database not found`` (a fresh InfluxDB 1.x)
makes the sink create the database once, as Telegraf's InfluxDB output does, and post the batch again, so
the first sample lands. Where it may not (a user without admin rights: 403; InfluxDB 2.x, whose database
is a DBRP mapping to a bucket) it says so once, and the lines go to the fallback as before."""

from __future__ import annotations

import logging

import requests

logger = logging.getLogger("dask_influx_metrics.sinks.http")  # the sink's own log


def create_database(session: requests.Session, query_url: str, database: str, headers: dict, auth, timeout) -> bool:
    """``CREATE DATABASE "<database>"`` on ``query_url`` (``/query``); True when it was created, else a warning
    that says why and what to do."""
    statement = 'CREATE DATABASE "' + database.replace("\\", "\\\\").replace('"', '\\"') + '"'
    try:
        r = session.post(query_url, params={"q": statement}, headers=headers, auth=auth, timeout=timeout)
        error = None if r.status_code < 300 else f"HTTP {r.status_code}: {r.text.strip()[:300]}"
        if error is None:
            error = ((r.json() or {}).get("results") or [{}])[0].get("error")
    except (requests.RequestException, ValueError) as e:
        error = str(e)
    if error is None:
        logger.info("HTTP sink: database %r was not found at %s: created it", database, query_url)
        return True
    logger.warning(
        "HTTP sink: database %r not found at %s, and it could not be created (%s): create it (CREATE DATABASE "
        "on InfluxDB 1.x, by an admin user), or on InfluxDB 2.x map it to a bucket (DBRP, deploy/README.md); "
        "until then the lines go to the undelivered copy",
        database,
        query_url.removesuffix("/query"),
        error,
    )
    return False
