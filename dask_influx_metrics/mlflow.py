from .client.mlflowlog import GPU, REFERENCE, log_summary  # noqa: F401  public path: dask_influx_metrics.mlflow.log_summary
