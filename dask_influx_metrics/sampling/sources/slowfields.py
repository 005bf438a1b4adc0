"""GPU fields whose NVML call is too slow for every sample: counters every 10 s, the fan once a second.

Declared like :data:`.nvml.TABLE` (one :class:`~.nvml.Group` per NVML call, with
the same variants/fields/converters), but :class:`SlowFields` makes each call at
most every ``interval_s`` of its entry in :data:`SLOW` per device, and the
fields appear only in the reading of the sample that made the call: never a
repeated, stale value. The counters (total energy, ECC errors) lose nothing when
read rarely, so they are read every :data:`COUNTER_INTERVAL_S` (10 s), and on
the first and the last sample (``read(final=True)``: a worker leaving, the
session ending), so that a session's energy is exact from counter to counter.
Costs per call on a real H200 (thread CPU, ``tests/data/nvml_h200_costs.md``):
total energy 3.1-3.7 ms, fan speed 113 us (NotSupported there), ECC mode 114 us
(the ECC counters were not timed; counted as slow).

Errors follow :mod:`.nvml`: NVML's "cannot" (NotSupported, NoPermission,
FunctionNotFound) switches a call off on that device for good, said once;
any other error leaves its fields out of this sample only (logged once).

>>> import sys; sys.path.insert(0, "tests"); from fake_nvml import FakeNvml
>>> nvml = FakeNvml("nvml_h100_shared.json"); nvml.nvmlInit()
>>> t = [0.0]
>>> slow = SlowFields(nvml, nvml.nvmlDeviceGetHandleByIndex(0), SLOW_FIELDS, clock=lambda: t[0])
>>> slow.read(), slow.read()
({'total_energy_consumption': 4389581}, {})
>>> t[0] = 1.0; slow.read()
{}
>>> t[0] = 10.0; slow.read(), slow.read(final=True)
({'total_energy_consumption': 4748435}, {'total_energy_consumption': 5153451})
"""

from __future__ import annotations

import logging
import time

from ...notices import Once
from .nvmlcalls import Call, Group

logger = logging.getLogger(__name__)

READ_INTERVAL_S = 1.0  # gauges (the fan)
COUNTER_INTERVAL_S = 10.0  # counters: energy, ECC errors


def _ecc(error_type: str, counter_type: str) -> Call:
    return Call("nvmlDeviceGetTotalEccErrors", (error_type, counter_type))


SLOW: dict[str, Group] = {
    "energy": Group((Call("nvmlDeviceGetTotalEnergyConsumption"),), {"total_energy_consumption": int}),  # mJ
    "fan": Group((Call("nvmlDeviceGetFanSpeed"),), {"fan_speed": float}),  # % of maximum
    "ecc_volatile_correctable": Group(
        (_ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),), {"ecc_errors_volatile_correctable": int}
    ),
    "ecc_volatile_uncorrectable": Group(
        (_ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),), {"ecc_errors_volatile_uncorrectable": int}
    ),
    "ecc_aggregate_correctable": Group(
        (_ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),), {"ecc_errors_aggregate_correctable": int}
    ),
    "ecc_aggregate_uncorrectable": Group(
        (_ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),), {"ecc_errors_aggregate_uncorrectable": int}
    ),
}
SLOW_FIELDS = frozenset(f for g in SLOW.values() for f in g.fields)


COUNTERS = frozenset({"energy", *(name for name in SLOW if name.startswith("ecc_"))})


class SlowFields:
    """The wanted :data:`SLOW` fields of one device, each call made at most every :data:`READ_INTERVAL_S`
    (counters: :data:`COUNTER_INTERVAL_S`).

    ``fields``: wanted field names. ``read()`` returns the fields read now
    (``{}`` between reads); ``read(final=True)`` reads every one now.
    """

    def __init__(self, nvml, handle, fields, *, label: str = "GPU", clock=time.monotonic):
        self._nvml, self._handle, self._label = nvml, handle, label
        self._clock = clock
        self._cannot = tuple(
            e
            for e in (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission, nvml.NVMLError_FunctionNotFound)
            if e is not None
        )
        # per wanted group: [name, group, wanted fields, the call bound to its constants, interval, next read at]
        self._plan = []
        for name, group in SLOW.items():
            wanted = [f for f in group.fields if f in fields]
            call = next((c for c in group.calls if all(getattr(nvml, n, None) is not None for n in c.names())), None)
            if wanted and call is not None:
                fn, args = getattr(nvml, call.function), tuple(getattr(nvml, a) for a in call.args)
                every = COUNTER_INTERVAL_S if name in COUNTERS else READ_INTERVAL_S
                self._plan.append([name, group, wanted, lambda h, fn=fn, args=args: fn(h, *args), every, None])
        self._once = Once()

    def read(self, final: bool = False) -> dict:
        now = self._clock()
        fields: dict = {}
        for entry in list(self._plan):
            name, group, wanted, call, every, due = entry
            if not final and due is not None and now < due:
                continue
            entry[5] = now + every
            try:
                raw = call(self._handle)
                fields.update({f: group.fields[f](raw) for f in wanted})
            except self._cannot as e:
                self._plan.remove(entry)
                logger.info(
                    "%s: %s not available (%s); omitted from now on", self._label, "/".join(wanted), type(e).__name__
                )
            except Exception as e:  # another NVML error, or a result unlike the documented one: this time only
                if self._once(name):
                    logger.warning(
                        "%s: reading %s failed (%s: %s); omitted from this sample (reported once)",
                        self._label,
                        "/".join(wanted),
                        type(e).__name__,
                        e,
                    )
        return fields
