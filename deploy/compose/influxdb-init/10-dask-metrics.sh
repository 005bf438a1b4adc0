#!/bin/sh
# Runs once, on the first start of the influxdb container (after its own setup
# created the org, the admin token and the raw bucket DOCKER_INFLUXDB_INIT_BUCKET
# with retention DOCKER_INFLUXDB_INIT_RETENTION). Adds what InfluxQL and the
# downsampling need: DBRP mappings, the 1-minute bucket and its Flux task.
set -eu
ORG="${DOCKER_INFLUXDB_INIT_ORG}"
RAW="${DOCKER_INFLUXDB_INIT_BUCKET}"
MEANS="${RAW}_1m"

raw_id=$(influx bucket list --org "$ORG" --name "$RAW" --hide-headers | cut -f1)
influx bucket create --org "$ORG" --name "$MEANS" --retention "${DOWNSAMPLED_RETENTION:-26w}"
means_id=$(influx bucket list --org "$ORG" --name "$MEANS" --hide-headers | cut -f1)

# InfluxQL (Grafana's InfluxQL datasource, the package's queries): database dask_metrics.
influx v1 dbrp create --org "$ORG" --db dask_metrics --rp autogen --bucket-id "$raw_id" --default
influx v1 dbrp create --org "$ORG" --db dask_metrics --rp downsampled_1m --bucket-id "$means_id"

influx task create --org "$ORG" --file /etc/dask-metrics/downsample.flux
