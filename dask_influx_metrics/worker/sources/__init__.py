"""What only the worker process can read: custom metrics (they get the worker object), the task stream
and Dask's fine performance metrics. Everything else is read by the host's agent (:mod:`...agent`)."""
