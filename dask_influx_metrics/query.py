# Public path: from dask_influx_metrics import query; the Store reads samples, the analyses take it (query.summary(db)).
from .client.accounting import accounting  # noqa: F401
from .client.csvfiles import to_csv  # noqa: F401
from .client.hosts import host_tables  # noqa: F401
from .client.peaks import get_peaks, peaks  # noqa: F401
from .client.query import QueryError, Store, connect, to_ns  # noqa: F401
from .client.report import report  # noqa: F401
from .client.summary import summary  # noqa: F401
from .client.tables import worker_tables  # noqa: F401
from .client.tasks import activity, gpu_during_tasks, gpu_per_prefix, task_stream, tasks  # noqa: F401
