"""How an NVML call is declared: its variants (:class:`Call`) and the fields its result gives (:class:`Group`).

Shared by the per-sample table (:data:`.nvml.TABLE`) and the slow fields (:mod:`.slowfields`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple


class Call(NamedTuple):
    """One variant of an NVML call: ``nvml.<function>(handle, *args, **keywords)``.

    ``args`` and the keyword values name pynvml constants.
    """

    function: str
    args: tuple[str, ...] = ()
    keywords: tuple[tuple[str, str], ...] = ()

    def names(self) -> tuple[str, ...]:
        """The pynvml names this variant needs."""
        return (self.function, *self.args, *(v for _, v in self.keywords))


class Group(NamedTuple):
    """One NVML call per device and sample, and the fields its result gives.

    ``calls``: the variants, best first. ``fields``: field -> its value from the
    result, in the unit of ``schema.FIELDS`` (``None``: no value this time).
    ``static``: fields read once per device and kept. ``per_worker``: the
    fields describe this worker, not the device; each converter then also gets
    the worker's process ids (host PIDs).
    """

    calls: tuple[Call, ...]
    fields: dict[str, Callable]
    static: frozenset = frozenset()
    per_worker: bool = False
