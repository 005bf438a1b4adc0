"""``Monitor``'s notebook view: each job's figures now (the dashboard page's table) and a link to the page.

Example
-------
>>> page_link("http://10.0.0.1:8787/status"), page_link("http://proxy/dask/other")
('http://10.0.0.1:8787/individual-gpu-jobs', None)
"""

from __future__ import annotations

import html

from ..names import DASHBOARD_PAGE
from ..scheduler.livestate import formatted

COLUMNS = (
    ("job", "Job"),
    ("label", "Label"),
    ("util", "GPU util now"),
    ("sm", "SM active now"),
    ("mem", "GPU memory held"),
    ("busy", "Busy GPU-s"),
    ("energy", "Energy"),
    ("dags", "DAGs running"),
)


def page_link(dashboard_link: str | None) -> str | None:
    """The page's address from Dask's ``distributed.dashboard.link`` (its ``status`` page swapped)."""
    base, _, last = (dashboard_link or "").rpartition("/")
    return f"{base}{DASHBOARD_PAGE}" if base and last == "status" else None


def to_html(client, on_scheduler) -> str:
    """The view of ``client``'s cluster; ``on_scheduler(action="live")`` runs there (``Monitor``'s). Never
    raises: a display must not fail."""
    try:
        state = client.run_on_scheduler(on_scheduler, action="live")
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
    header = "".join(f"<th>{title}</th>" for _, title in COLUMNS)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(r[k])}</td>" for k, _ in COLUMNS) + "</tr>"
        for r in map(formatted, state["jobs"])
    )
    empty = "" if state["jobs"] else f'<tr><td colspan="{len(COLUMNS)}">no job yet</td></tr>'
    return (
        f"<div><p><b>Monitor</b>: {head}{page}</p>"
        f"<table><thead><tr>{header}</tr></thead><tbody>{rows}{empty}</tbody></table></div>"
    )
