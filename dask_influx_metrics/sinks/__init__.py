"""Sinks: where encoded lines go. Each has ``send(lines)`` and ``close()``.

``send`` takes a list of encoded line-protocol lines (``bytes``, no newline),
never raises and never blocks the sampler for long; ``close`` flushes.
"""

from __future__ import annotations

from typing import Protocol


class Sink(Protocol):
    def send(self, lines: list[bytes]) -> None:
        """Hand lines over for delivery."""

    def close(self) -> None:
        """Flush what is buffered and release resources."""
