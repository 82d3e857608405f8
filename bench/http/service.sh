#!/usr/bin/env bash
# Sourced (from the top of the repository) by the scripts of bench/http that
# run an example service against a throwaway cluster: languages.sh,
# profile_node.sh, perf_node.sh, profile_python.sh. The caller sets `work` (a
# fresh folder) and `service=""`, and its EXIT trap kills "$service" and stops
# "$work/pg".

# node_installed EXAMPLE...: client/node built and each Node example's packages
# installed from their lock files (npm ci), as the tests install them; what is
# there already is kept.
node_installed() {
  [[ -f client/node/dist/index.js ]] || (cd client/node && npm ci --no-audit --no-fund --loglevel=error)
  local example
  for example in "$@"; do
    [[ -d examples/$example/node_modules ]] || (cd "examples/$example" && npm ci --no-audit --no-fund --loglevel=error)
  done
}

# start_shop PORT: a cluster in $work/pg on PORT (fsync on), its environment
# sourced, a database shop with the extension and synchronous_commit on;
# sets http_port (PORT + 1) for the service.
start_shop() {
  PGCLUSTER_CONF="fsync = on" scripts/pgcluster.sh start "$work/pg" "$1" >/dev/null
  # shellcheck disable=SC1091
  source "$work/pg/env"
  psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE shop"
  psql -X -q -v ON_ERROR_STOP=1 -d shop -c "CREATE EXTENSION idempotency" \
    -c "ALTER DATABASE shop SET synchronous_commit = on"
  http_port=$((PGPORT + 1))
}

# start_service COMMAND...: the previous service stopped, COMMAND --port
# --threads 8 --dsn (database shop) in the background, its pid in `service`;
# returns once GET /health answers, fails (with the service's log) if it does
# not within 10 s.
start_service() {
  [[ -n $service ]] && kill "$service" 2>/dev/null && wait "$service" 2>/dev/null || true
  "$@" --port "$http_port" --threads 8 --dsn "host=$PGHOST port=$PGPORT dbname=shop user=postgres" \
    2>>"$work/service.log" &
  service=$!
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$http_port/health" >/dev/null && return 0; sleep 0.1; done
  echo "service did not come up" >&2
  cat "$work/service.log" >&2
  return 1
}
