"""Names the scheduler, the workers, the agent and the client agree on (plugin names, the task
annotation, the event topic and the kinds of report sent on it)."""

import enum
import socket

JOBS_PLUGIN = "influx-metrics-jobs"  # the scheduler plugin
WORKER_PLUGIN = "influx-metrics"  # the worker plugin
ANNOTATION = "influx_metrics"  # task annotation key: {"session", "job", "dag"}
EVENT_TOPIC = "influx-metrics"  # worker and agent reports: {"worker", "what", "message", ...}
SHARED_GPU = "shared-gpu"  # a report's "what" when workers of a host use one GPU
CUSTOM_METRIC = "custom-metric"  # a report's "what": a custom metric failed or overran ("metric", "problem")
DESTINATIONS = "destinations"  # a report's "what": where a worker's samples go (sinks.destinations)
PRELOAD = "preload"  # a report's "what" (from the scheduler): --preload could not start monitoring, and why
NEW_JOB_OP = "influx-metrics-new-job"  # the client's stream op behind Monitor.new_job()


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
