"""``python -m dask_influx_metrics.demo``: see :mod:`dask_influx_metrics.demo`."""

import sys

from . import main

sys.exit(main())
