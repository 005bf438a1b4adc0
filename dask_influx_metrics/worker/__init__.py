"""Runs in each Dask worker process, wired by :mod:`.plugin`: publishes what the worker runs to its host's
sampling agent (or samples itself, ``sampler.mode: thread``), and makes what needs the worker object (custom
metrics, the task stream) into its outbox.
"""
