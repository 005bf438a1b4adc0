#!/bin/sh
# Compose interpolates every service of compose.yaml whatever COMPOSE_PROFILES picks
# (docker/compose#11977), so a value only one profile needs cannot be ${VAR:?} there: it is
# ${VAR:-} and checked here, when that profile's container starts.
# Usage: require-env.sh NAME... -- COMMAND [ARG...]: exit 1 naming every empty NAME (the
# container gets each under its .env name), else run COMMAND.
set -eu
missing=""
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  eval "value=\${$1:-}"
  [ -n "$value" ] || missing="$missing $1"
  shift
done
[ "$#" -gt 0 ] && shift
if [ -n "$missing" ]; then
  echo "missing in deploy/compose/.env (this profile needs them; see .env.example):$missing" >&2
  exit 1
fi
exec "$@"
