#!/usr/bin/env bash
# Every example service while its database fails under it (issue 41): on a
# throwaway cluster of its own (it stops, crashes and restarts it), each service
# is started while the database is down, must answer /health, and must serve
# once the database is back; then tests/faults/driver.py runs 8 clients over a
# small key space with backend terminations, cancels and one immediate restart,
# and checks one effect per key, byte-identical 2xx per key, no stuck key and
# every fault answered with protocol.json's database_fault (503). The service
# must be alive at the end. examples/proxy-service (the lease protocol, an
# effect outside the database) runs the driver's --mode proxy: its checks allow
# the upstream call that a holder which lost its lease or its completion may
# have made (tests/faults/driver.py). About 25 s per service, 3-4 minutes in all.
#
#   FAULTS_SERVICES    the services to run (default: all nine, by name below)
#   FAULTS_SECONDS     seconds of load per service (default 16)
#   FAULTS_START_DOWN  0: start each service with the database up (default 1)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${BUILD_DIR:-build-test}
all_services="orders-service python-orders asgi-orders django-orders node-orders fastify-orders go-orders rust-orders proxy-service"
services=${FAULTS_SERVICES:-$all_services}
seconds=${FAULTS_SECONDS:-16}
start_down=${FAULTS_START_DOWN:-1}
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}

# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
# The Python services run in client/python's venv (the built wheel): its bin first on
# PATH, where their `env python3` finds it.
if [[ " $services " =~ \ (python|asgi|django)-orders\  ]]; then
  PATH=$(client/python/tools/env.sh /usr/bin/python3)/bin:$PATH || exit 1
fi
cluster="$work/pg"
# Ports the other suites leave free beside the run's cluster (+40..+46: the model checker,
# +50, +51: binding_paths.sh): the cluster at +60, the services at +61...
base_port=$((${PGPORT:-$((20000 + RANDOM % 6000))} + 60))
trap 'scripts/pgcluster.sh stop "$cluster" >/dev/null 2>&1; cleanup_service_test' EXIT
if ! scripts/pgcluster.sh start "$cluster" "$base_port" >/dev/null; then
  echo "not ok - a cluster of its own"
  exit 1
fi
# shellcheck disable=SC1091
source "$cluster/env"

as_postgres() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pg_ctl_() { as_postgres "$PGBIN/pg_ctl" -D "$cluster/data" "$@"; }
db_up() { pg_ctl_ -l "$cluster/server.log" -w -t 60 start >/dev/null; }
db_down() { pg_ctl_ -m fast -w stop >/dev/null; }
restart_cmd="$(declare -f as_postgres); PGBIN='$PGBIN' cluster='$cluster';"
restart_cmd+=" as_postgres \"\$PGBIN/pg_ctl\" -D \"\$cluster/data\" -m immediate -w stop"
restart_cmd+=" >/dev/null &&"
restart_cmd+=" sleep 1 && as_postgres \"\$PGBIN/pg_ctl\" -D \"\$cluster/data\""
restart_cmd+=" -l \"\$cluster/server.log\" -w -t 60 start >/dev/null"

# binary_of NAME: the command that runs the service (built here when it must be).
binary_of() {
  case $1 in
  orders-service | proxy-service) echo "$build/$1" ;;
  python-orders | asgi-orders | django-orders)
    echo "examples/$1/app.py"
    ;;
  node-orders | fastify-orders)  # client/node as built; the example from its lock file
    [[ -f client/node/dist/index.js ]] || return 1
    (cd "examples/$1" && npm ci --no-audit --no-fund --loglevel=error >&2) || return 1
    echo "examples/$1/app.js"
    ;;
  go-orders)
    (cd examples/go-orders && go build -o "$work/go-orders" .) || return 1
    echo "$work/go-orders"
    ;;
  rust-orders)
    # The machine's cargo, the crates pinned by the example's Cargo.lock (issue 37),
    # into the run's CARGO_TARGET_DIR (scripts/test.sh), else build/rust.
    local target=${CARGO_TARGET_DIR:-$PWD/build/rust}
    (cd examples/rust-orders && CARGO_TARGET_DIR="$target" cargo build --release --locked --quiet) ||
      return 1
    echo "$target/release/rust-orders"
    ;;
  *) return 1 ;;
  esac
}

# wait_for_schema: the service made its tables once the database was back.
wait_for_schema() {
  for _ in $(seq 150); do
    local made
    made=$(psql -X -qAt -d "$service_db" -c "SELECT to_regclass('orders') IS NOT NULL" 2>/dev/null)
    [[ $made == t ]] && return 0
    sleep 0.2
  done
  return 1
}

# alive PID: running, not a zombie (the service is this shell's child until waited for).
alive() { [[ -r /proc/$1/status ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }

offset=0
for name in $services; do
  offset=$((offset + 1))
  failed_before=$failures
  # The services' ports step by two: proxy-service's upstream listens on its port + 1.
  port=$((base_port + 2 * offset))
  echo "# $name"
  if ! binary=$(binary_of "$name") || [[ ! -x $binary ]]; then
    check "$name: built" false
    continue
  fi
  fresh_database "idem_faults_${name//-/_}"
  [[ $start_down == 1 ]] && db_down
  # proxy-service: a lease short enough that the final pass outlives a dead holder's.
  extra=()
  [[ $name == proxy-service ]] && extra=(--lease-ms 1000)
  if ! start_service "$port" "$binary" "${extra[@]}"; then
    check "$name: starts while the database is down" false
    db_up
    continue
  fi
  pid=${service_pids[-1]}
  if [[ $start_down == 1 ]]; then
    check "$name: answers /health while the database is down" true
    db_up
  fi
  mode=(--mode orders)
  if [[ $name == proxy-service ]]; then  # no tables of its own
    mode=(--mode proxy --upstream-url "http://127.0.0.1:$((port + 1))")
  else
    check "$name: serves once the database is back (its tables made)" wait_for_schema
  fi
  check "$name: keeps its idempotency under database faults" \
    /usr/bin/python3 tests/faults/driver.py "${mode[@]}" \
    --label "$name" --base-url "http://127.0.0.1:$port" --seconds "$seconds" \
    --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}" \
    --restart-cmd "$restart_cmd"
  check "$name: alive at the end" alive "$pid"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if ((failures > failed_before)); then tail -n 80 "$work/service.log" | sed 's/^/#   /'; fi
  : >"$work/service.log"
done
cd "$root" && report
