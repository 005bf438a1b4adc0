"""What the agent reads: NVML (or simulated GPUs), ``/proc`` for the host and each worker process,
and each worker's published tasks."""
