"""``python -m dask_influx_metrics.agent``: the host's sampling agent (started by a worker, see :mod:`.process`)."""

import sys

from .process import main

sys.exit(main())
