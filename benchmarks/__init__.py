"""Benchmarks of dask-influx-metrics; ``python -m benchmarks`` runs them all (see README.md here).

Each module in :data:`MODULES` has ``run(quick: bool) -> list[dict]`` returning
result rows (:func:`benchmarks.common.row`) and runs alone with
``python -m benchmarks.<name> [--quick]``. Adding a benchmark is one entry here.
"""

#: Benchmark modules, in running order. A listed module that does not exist
#: (yet) is skipped with a note.
MODULES = (
    "workload",
    "sampler",
    "encode",
    "delivery",
    "memory",
    "gaps",
    "query",
    "csvpeaks",
    "cardinality",
    "taskstream",
    "hostonce",
    "gpm",
    "clusterlife",
    "hostreads",
    "sessiontag",
    "live",
    "hostcost",
    "accounting",
)
