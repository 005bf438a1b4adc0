"""Runs in each Dask worker process: sources -> sampler -> sinks, wired by :mod:`.plugin`.

The scheduler reuses :mod:`.sinks` for its own ``dag`` points; the client reads
spool files with :mod:`.sinks.spool`'s readers.
"""
