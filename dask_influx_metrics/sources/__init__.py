"""Sources: where samples come from. Each has ``read() -> list[Reading]``.

GPU sources (``nvml``, ``simulated``) also expose ``handles`` (one per device,
passed to custom metrics) and ``close()``.
"""

from __future__ import annotations

from typing import Protocol

from ..schema import Reading


class Source(Protocol):
    def read(self) -> list[Reading]:
        """Return this moment's readings; one bad field never drops the rest."""
