"""The sampling library: what a sample reads (``sources``: NVML or simulated GPUs, ``/proc`` for the host
and each worker process, its published tasks), how one sample of a host is put together (``collect``),
opening the host's GPUs (``gpus``) and the drift-free loop (``sampler``). Used by the host's agent
process (:mod:`..agent`) and by a worker sampling itself (``sampler.mode: thread``).
"""
