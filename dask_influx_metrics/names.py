"""Names the scheduler, the workers, the agent and the client agree on (plugin names, the task
annotation, the event topic and the kinds of report sent on it, session ids, task prefixes)."""

import calendar
import enum
import functools
import re
import secrets
import socket
import sys
import time
from typing import Optional

JOBS_PLUGIN = "influx-metrics-jobs"  # the scheduler plugin
WORKER_PLUGIN = "influx-metrics"  # the worker plugin
ANNOTATION = "influx_metrics"  # task annotation key: {"session", "job", "dag"}
EVENT_TOPIC = "influx-metrics"  # worker and agent reports: {"worker", "what", "message", ...}
SHARED_GPU = "shared-gpu"  # a report's "what" when workers of a host use one GPU
CUSTOM_METRIC = "custom-metric"  # a report's "what": a custom metric failed or overran ("metric", "problem")
DESTINATIONS = "destinations"  # a report's "what": where a worker's samples go (sinks.destinations)
PRELOAD = "preload"  # a report's "what" (from the scheduler): --preload could not start monitoring, and why
NEW_JOB_OP = "influx-metrics-new-job"  # the client's stream op behind Monitor.new_job()
LIVE_METRIC = "influx_metrics"  # a worker's heartbeat entry (Worker.metrics): its live figures
DASHBOARD_PAGE = "/individual-gpu-jobs"  # the scheduler dashboard's page ("GPU Jobs" in its "More" menu)


class GpuState(str, enum.Enum):
    """What a worker found of its GPUs (recorded with its destinations; like distributed's ``NVMLState``)."""

    NVML = "nvml"  # NVML runs; the worker's devices are listed (none: see NONE_VISIBLE)
    NONE_VISIBLE = "none-visible"  # NVML runs but no device is visible to the worker (CUDA_VISIBLE_DEVICES)
    SIMULATED = "simulated"
    OFF = "off"  # gpu.source: none
    NO_NVML = "no-nvml"  # pynvml (nvidia-ml-py) is not installed
    NO_DRIVER = "no-driver"  # NVML could not start: no driver or no GPU
    ERROR = "error"  # the worker's CUDA_VISIBLE_DEVICES could not be resolved


class GpmState(str, enum.Enum):
    """Whether a GPU gives GPM metrics (recorded per device with the worker's destinations)."""

    ON = "on"
    UNSUPPORTED = "unsupported"  # the device (older than Hopper) or its driver has no GPM
    NO_CALLS = "no-gpm-calls"  # this pynvml lacks the GPM calls (nvidia-ml-py >= 12.535 has them)
    ERROR = "error"  # NVML failed when asked


def agent_role() -> str:
    """The host agent's name in sinks, spool folders and ``delivery`` points: ``agent-<host>``."""
    return f"agent-{socket.gethostname()}"


_SESSION_ID = re.compile(r"^(\d{8}T\d{6})-(\d{6})(?:-[0-9a-f]+)?$")


def new_session_id(started: float) -> str:
    """A session id: the start (UTC, to the microsecond, so ids sort by start) and 24 random bits, so two
    schedulers starting in the same microsecond still differ. 29 characters: the tag ``,session=<id>``
    adds 38 bytes to a line (the field ``,session="<id>"`` 40).

    >>> len(new_session_id(1795255200.25)), new_session_id(1795255200.25)[:22]
    (29, '20261121T100000-250000')
    """
    micro = int(round(started * 1e6)) % 1_000_000
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(int(started))) + f"-{micro:06d}-{secrets.token_hex(3)}"


def session_start_ns(session_id: str) -> Optional[int]:
    """The start time (epoch ns) a session id names; None for another name (a spool folder renamed by hand).

    >>> session_start_ns("20261121T100000-250000-3fa9c2"), session_start_ns("20261121T100000-000001")
    (1795255200250000000, 1795255200000001000)
    >>> session_start_ns("nightly") is None
    True
    """
    m = _SESSION_ID.match(str(session_id))
    if m is None:
        return None
    seconds = calendar.timegm(time.strptime(m.group(1), "%Y%m%dT%H%M%S"))
    return seconds * 10**9 + int(m.group(2)) * 1000


_HEX_WORD = re.compile("[a-f]+")
_TOKEN = re.compile(r"[a-f0-9]{32}")


@functools.lru_cache(4096)
def key_prefix(key) -> str:
    """A task key's prefix by Dask's rule (``dask.utils.key_split``, which ``tests/test_names.py`` holds it
    to): the host agent names the prefixes a worker executes without importing Dask, which would cost it
    ~130 ms of CPU and ~8 MB of memory at the first task it sees.

    >>> key_prefix(("sum-aggregate-2a1f", 3)), key_prefix("x-abcdefab-1"), key_prefix("_(x)"), key_prefix(None)
    ('sum-aggregate', 'x', 'x', 'Other')
    """
    if type(key) is bytes:
        return key_prefix(key.decode())
    if type(key) is tuple:
        return key_prefix(key[0])
    try:
        words = key.split("-")
        result = words[0] if words[0][0].isalpha() else words[0].split(",")[0].strip("_'()\"")
        for word in words[1:]:
            if not word.isalpha() or (len(word) == 8 and _HEX_WORD.match(word) is not None):
                break
            result += f"-{word}"
        if len(result) == 32 and _TOKEN.match(result):
            return "data"
        if result[0] == "<":
            result = result.strip("<>").split()[0].split(".")[-1]
        return sys.intern(result)
    except Exception:  # as Dask's: a key of another type is "Other"
        return "Other"
