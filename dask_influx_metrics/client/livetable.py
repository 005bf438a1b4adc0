"""``Monitor``'s notebook view: each job's figures now (the dashboard page's table) and a link to the page.

Example
-------
>>> page_link("http://10.0.0.1:8787/status"), page_link("http://proxy/dask/other")
('http://10.0.0.1:8787/individual-gpu-jobs', None)
"""

from __future__ import annotations

import html
import time

from ..names import DASHBOARD_PAGE, JOBS_PLUGIN
from ..scheduler.dashboard import JOB_COLUMNS, html_table
from ..scheduler.livestate import formatted


def page_link(dashboard_link: str | None) -> str | None:
    """The page's address from Dask's ``distributed.dashboard.link`` (its ``status`` page swapped)."""
    base, _, last = (dashboard_link or "").rpartition("/")
    return f"{base}{DASHBOARD_PAGE}" if base and last == "status" else None


def on_scheduler(dask_scheduler=None) -> dict | None:
    """Runs on the scheduler (``run_on_scheduler``): the session and each job's figures now; None when no
    monitor is attached."""
    plugin = dask_scheduler.plugins.get(JOBS_PLUGIN)
    if plugin is None:
        return None
    session = plugin.session or plugin.last_session
    rows = plugin.live.jobs(time.time(), plugin.book) if plugin.live is not None else []
    return {"session": session and session["id"], "running": plugin.session is not None, "jobs": rows}


def to_html(client) -> str:
    """The view of ``client``'s cluster. Never raises: a display must not fail."""
    try:
        state = client.run_on_scheduler(on_scheduler)
    except Exception as e:  # a closed client
        return f"<p><b>Monitor</b>: cannot reach the scheduler ({html.escape(type(e).__name__)})</p>"
    try:
        link = page_link(client.dashboard_link)
    except Exception:  # no dashboard
        link = None
    page = f' &middot; <a href="{html.escape(link)}" target="_blank">GPU Jobs page</a>' if link else ""
    if state is None:
        return f"<p><b>Monitor</b> of {html.escape(str(client.scheduler.address))}: not attached{page}</p>"
    head = (
        f"session {html.escape(state['session'])} {'running' if state['running'] else 'stopped'}"
        if state["session"]
        else "no session yet"
    )
    table = html_table(JOB_COLUMNS, [formatted(r) for r in state["jobs"]], "no job yet")
    return f"<div><p><b>Monitor</b>: {head}{page}</p>{table}</div>"
