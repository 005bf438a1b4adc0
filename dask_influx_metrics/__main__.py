"""``python -m dask_influx_metrics``: the command line (see :mod:`dask_influx_metrics.client.cli`)."""

from .client.cli import main

if __name__ == "__main__":
    main()
