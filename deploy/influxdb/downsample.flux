// InfluxDB 2.x task: 1-minute means of the raw samples, kept for months.
// Raw bucket "dask_metrics" keeps days (its retention); "dask_metrics_1m" keeps
// the means (created with a long retention by compose/influxdb-init/10-dask-metrics.sh).
// String fields (worker.running, dag.*, the dag field of dag-tag: false) are not averaged;
// dag events stay raw only.
option task = {name: "dask-metrics-downsample-1m", every: 1m, offset: 15s}

from(bucket: "dask_metrics")
    |> range(start: -task.every)
    |> filter(fn: (r) => r._measurement == "gpu" or r._measurement == "host" or r._measurement == "worker")
    |> filter(fn: (r) => r._field != "running" and r._field != "dag")
    |> toFloat()
    |> aggregateWindow(every: 1m, fn: mean, createEmpty: false)
    |> to(bucket: "dask_metrics_1m")
