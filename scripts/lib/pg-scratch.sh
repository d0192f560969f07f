# Sourced by the scripts that measure the PostgreSQL server at
# HERALD_DATABASE_URL alone (pg-write-ceiling, pg-read-order), from the
# repository's root: a scratch database with Herald's schema, as
# `herald migrate` of a release build (like scripts/bench) creates it.
#
#   pg_scratch NAME   creates NAME (after dropping a leftover one), builds
#                     herald, migrates NAME and sets SCRATCH to its URL;
#   pg_scratch_drop   drops it again (call it from the script's EXIT trap);
#   timed LABEL CMD…  runs CMD, then prints LABEL (if any), its wall time and
#                     the busy CPU seconds of the whole machine meanwhile
#                     (/proc/stat: user nice system irq softirq steal).
: "${HERALD_DATABASE_URL:?set HERALD_DATABASE_URL to a PostgreSQL server (postgres://user@host:port/db)}"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"

pg_scratch() {
  PG_SCRATCH_NAME=$1
  psql -X -q "$HERALD_DATABASE_URL" -c "DROP DATABASE IF EXISTS $PG_SCRATCH_NAME" -c "CREATE DATABASE $PG_SCRATCH_NAME"
  SCRATCH=$(python3 -c 'import sys, urllib.parse as u; p = u.urlparse(sys.argv[1]); print(u.urlunparse(p._replace(path="/" + sys.argv[2])))' \
    "$HERALD_DATABASE_URL" "$PG_SCRATCH_NAME")
  nice cargo build --release -q -p herald
  "${CARGO_TARGET_DIR:-target}/release/herald" migrate --database "$SCRATCH" >/dev/null
}

pg_scratch_drop() {
  if [ -n "${PG_SCRATCH_NAME:-}" ]; then
    psql -X -q "$HERALD_DATABASE_URL" -c "DROP DATABASE IF EXISTS $PG_SCRATCH_NAME" >/dev/null 2>&1 || true
  fi
}

busy_cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '/^cpu / { printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat; }

timed() {
  local label=$1 started cpu
  shift
  started=$(date +%s%N)
  cpu=$(busy_cpu_seconds)
  "$@"
  awk -v label="$label" -v ms="$(( ($(date +%s%N) - started) / 1000000 ))" -v a="$(busy_cpu_seconds)" -v b="$cpu" \
    'BEGIN { if (label != "") print label; printf "          %d ms, machine CPU %.2f s\n", ms, a - b }'
}
