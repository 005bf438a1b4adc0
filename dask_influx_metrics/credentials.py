"""InfluxDB credentials: out of URLs, into one ``Authorization`` header, masked wherever shown.

Writers (``sinks/http.py``) and readers (``client/query/``) both use
these. A URL may carry ``user:password@``; :func:`split_url` (:func:`take`,
with credentials given beside it) takes them out (the URL is then safe to
log, repr and put in exceptions) and
:func:`auth_header` turns them, or a token, into the one header that carries
them. :func:`mask_url` is for showing a URL as given.

>>> split_url("http://me:s%40cret@influx:8086/")
('http://influx:8086/', 'me', 's@cret')
>>> mask_url("https://me:secret@influx:8086")
'https://me:***@influx:8086'
>>> auth_header("me", "secret")
{'Authorization': 'Basic bWU6c2VjcmV0'}
>>> auth_header(token="t0k"), auth_header()
({'Authorization': 'Token t0k'}, {})
"""

from __future__ import annotations

import base64
from typing import Optional
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"


def _netloc(parts, password: Optional[str]) -> str:
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # IPv6 literal
    port = f":{parts.port}" if parts.port is not None else ""
    if parts.username is None:
        return host + port
    user = parts.username + (f":{password}" if password is not None else "")
    return f"{user}@{host}{port}"


def split_url(url: str) -> tuple[str, Optional[str], Optional[str]]:
    """``(url without user:password@, username, password)``; names are URL-decoded.

    >>> split_url("http://127.0.0.1:8086")
    ('http://127.0.0.1:8086', None, None)
    >>> split_url("http://admin@[::1]:8086")
    ('http://[::1]:8086', 'admin', None)
    """
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    clean = urlunsplit(parts._replace(netloc=_netloc(parts._replace(netloc=parts.netloc.rpartition("@")[2]), None)))
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return clean, user, password


def take(url: str, username: Optional[str] = None, password: Optional[str] = None):
    """``(url without user:password@, username, password)``: those given win over the URL's.

    >>> take("http://me:pw@h:8086", password="other")
    ('http://h:8086', 'me', 'other')
    """
    url, url_user, url_password = split_url(url)
    return url, username or url_user, password if password is not None else url_password


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (nothing else changes)."""
    parts = urlsplit(str(url))
    if parts.password is None:
        return str(url)
    return urlunsplit(parts._replace(netloc=_netloc(parts, MASK)))


def auth_header(username: Optional[str] = None, password: Optional[str] = None, token: Optional[str] = None) -> dict:
    """``{"Authorization": ...}``: ``Token <token>`` (2.x/3.x), else ``Basic`` for a 1.x user; ``{}`` for none."""
    if token:
        return {"Authorization": f"Token {token}"}
    if username:
        pair = f"{username}:{password or ''}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
    return {}


def mask(text: str, *secrets) -> str:
    """``text`` with every non-empty secret replaced by ``***`` (for messages built from foreign text).

    >>> mask("failed for me:hunter2", "hunter2", None)
    'failed for me:***'
    """
    for secret in secrets:
        if secret:
            text = text.replace(str(secret), MASK)
    return text
