# Shared by the HTTP end-to-end tests (sourced, not run): a fresh database with
# the extension, an example service on a loopback port, TAP-style checks.
# Sets work (a temporary folder) and cleans up on exit.

work=$(mktemp -d)
service_pids=()
service_db=""
cleanup_service_test() {
  for pid in "${service_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
  [[ -n $service_db ]] && psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $service_db WITH (FORCE)" >/dev/null 2>&1
  return 0
}
trap cleanup_service_test EXIT

# fresh_database NAME: drops and creates it, with the extension.
fresh_database() {
  service_db=$1
  psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1"
  psql -X -q -v ON_ERROR_STOP=1 -d "$1" -c "CREATE EXTENSION idempotency"
}

# wait_for_tables TABLE...: the service made its tables in service_db. The example
# services answer /health at once and make their tables once the database answers
# (they start while it is down), so a test waits for both before its first request.
wait_for_tables() {
  local table missing
  for _ in $(seq 150); do
    missing=0
    for table in "$@"; do
      [[ $(psql -X -qAt -d "$service_db" -c "SELECT to_regclass('$table') IS NOT NULL" 2>/dev/null) == t ]] ||
        missing=1
    done
    ((missing)) || return 0
    sleep 0.2
  done
  echo "the service did not make its tables ($*) within 30 s:" >&2
  cat "$work/service.log" >&2
  return 1
}

# start_service PORT BINARY ARGS...: starts it against service_db and waits for /health.
start_service() {
  local port=$1 binary=$2
  shift 2
  "$binary" --port "$port" --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}" "$@" \
    2>>"$work/service.log" &
  service_pids+=($!)
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null && return 0; sleep 0.1; done
  echo "service on port $port did not come up:" >&2
  cat "$work/service.log" >&2
  return 1
}

passes=0
failures=0
# check DESCRIPTION COMMAND...: runs the command; prints ok / not ok.
check() {
  local what=$1
  shift
  if "$@"; then echo "ok - $what"; passes=$((passes + 1)); else echo "not ok - $what"; failures=$((failures + 1)); fi
}

# header OUT NAME: the value of a header saved by curl -D OUT.h
header() { grep -i "^$2:" "$1.h" | head -1 | cut -d' ' -f2- | tr -d '\r'; }

# report: the closing line, and the exit status.
report() {
  echo "$passes passed, $failures failed"
  ((failures == 0))
}
