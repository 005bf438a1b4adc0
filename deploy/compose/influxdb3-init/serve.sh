#!/bin/sh
# InfluxDB 3 Core for dask-influx-metrics: start the server with the admin token from
# $INFLUX3_TOKEN (an offline admin token file), then create the database $INFLUX_BUCKET
# with retention $INFLUX_RETENTION (a no-op once it exists). Auth stays on for every endpoint.
set -eu
case "${INFLUX3_TOKEN-}" in
  apiv3_*) ;;
  "") echo "missing in deploy/compose/.env (this profile needs them; see .env.example): INFLUX3_TOKEN" >&2; exit 1 ;;
  *) echo "INFLUX3_TOKEN must start with apiv3_ (e.g. apiv3_\$(openssl rand -hex 32))" >&2; exit 1 ;;
esac
umask 077
admin_file="${TMPDIR:-/tmp}/admin-token.json"   # influxdb3's offline admin token format
printf '{"%s": "%s", "name": "_admin"}\n' token "$INFLUX3_TOKEN" > "$admin_file"
influxdb3 serve --node-id dask-metrics --object-store file --data-dir /var/lib/influxdb3/data \
  --admin-token-file "$admin_file" &
server=$!
until influxdb3 show databases >/dev/null 2>&1; do sleep 1; done
influxdb3 create database "$INFLUX_BUCKET" --retention-period "$INFLUX_RETENTION" 2>/dev/null || true
wait "$server"
