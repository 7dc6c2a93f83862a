#!/usr/bin/env bash
# Start (or reuse) a throwaway PostgreSQL server for the tests and print its SQLAlchemy URL.
# The cluster lives in /tmp, listens on 127.0.0.1 only, and trusts local connections; it is for
# tests, never for data. Without PostgreSQL installed it fails in one line, or, given --optional or
# SYSTEM_DEPS=skip, prints nothing: the tests then skip the PostgreSQL variants, saying why.
set -euo pipefail
PORT=${PALESTRA_PG_PORT:-54329}
DATA=${PALESTRA_PG_DIR:-/tmp/palestra-pg-$PORT}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bin" ]; then
  [ "${1:-}" = --optional ] || [ "${SYSTEM_DEPS:-install}" = skip ] && exit 0
  echo "palestra: PostgreSQL is not installed, and make test runs the store tests on it too:" \
       "'make system-deps' installs it (as root), or 'make test SYSTEM_DEPS=skip' skips those tests" >&2
  exit 1
fi
trap 'echo "palestra: the test PostgreSQL server did not start (its log: $DATA/server.log)" >&2' ERR
as_owner() {  # postgres refuses to run as root
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
if ! as_owner "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" 2>/dev/null; then
  if [ ! -f "$DATA/PG_VERSION" ]; then
    mkdir -p "$DATA"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$DATA"
    as_owner "$bin/initdb" -D "$DATA" -U palestra --auth=trust >/dev/null
  fi
  as_owner "$bin/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w \
    -o "-h 127.0.0.1 -p $PORT -k $DATA -c fsync=off -c max_connections=200" start >/dev/null
fi
as_owner "$bin/psql" -h 127.0.0.1 -p "$PORT" -U palestra -d postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname='palestra_test'" | grep -q 1 ||
  as_owner "$bin/createdb" -h 127.0.0.1 -p "$PORT" -U palestra palestra_test
echo "postgresql+psycopg://palestra@127.0.0.1:$PORT/palestra_test"
