"""Telling a problem once: one warning line in this process's log, and the same event on to the session.

Example
-------
>>> sent = []
>>> report = Reporter(sent.append, worker="tcp://w:1")
>>> report.once("gpu-source", "NVML could not start"); report.once("gpu-source", "NVML could not start")
True
False
>>> sent[0]["what"], sent[0]["worker"], len(sent)
('gpu-source', 'tcp://w:1', 1)
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

logger = logging.getLogger("dask_influx_metrics")


QUOTE_CHARS = 200  # the most of a value (a custom metric's return, an error text) a message repeats


def clip(text, limit: int = QUOTE_CHARS) -> str:
    """``text`` as a message quotes it: at most ``limit`` characters, the rest counted, never repeated.

    >>> clip("x" * 100_000)[-30:]
    'xxxxx... (100000 characters)'
    """
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class Once:
    """Things said already: ``once(key)`` is True the first time for each ``key`` (thread-safe).

    >>> once = Once(); once("gpu"), once("gpu")
    (True, False)
    """

    def __init__(self):
        self._said: set = set()
        self._lock = threading.Lock()

    def __call__(self, key) -> bool:
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
            return True


class Reporter:
    """``report(what, message, **details)`` logs a warning and passes ``{what, message, **details,
    **context}`` to ``send`` (a scheduler event, the agent's beat), which must not raise;
    :meth:`once` does so the first time for each ``key`` (default ``(what, message)``)."""

    def __init__(self, send: Callable[[dict], None] | None = None, **context):
        self._send, self.context = send, context
        self._once = Once()

    def __call__(self, what: str, message: str, **details) -> None:
        logger.warning(
            "influx-metrics%s: %s", f" on {self.context['worker']}" if "worker" in self.context else "", message
        )
        if self._send is not None:
            try:
                self._send({**details, **self.context, "what": what, "message": message})
            except Exception:  # the event is a courtesy; the log line above is the record
                pass

    def once(self, what: str, message: str, key=None, **details) -> bool:
        """Report unless ``key`` was reported before; whether it was reported now."""
        if not self._once((what, message) if key is None else key):
            return False
        self(what, message, **details)
        return True
