#!/usr/bin/env bash
# Requests per second of examples/orders-service with and without the
# idempotency wrapper, fresh key per request, 8 concurrent connections with wrk
# on loopback, interleaved rounds, medians:
#   wrapped  POST /orders: the client library on an idem::Connection with a
#            pqxx::transaction_base& handler (BEGIN + begin(), INSERT,
#            complete() + COMMIT: three round trips)
#   classic  POST /classic/orders: the same with a pqxx::work& handler
#            (BEGIN, begin(), INSERT, complete(), COMMIT: five)
#   plain    POST /plain/orders: the same handler in a plain transaction (three)
# Once with synchronous_commit off (CPU and round trips show) and once with it
# on (fsync on).
#
#   bench/http/run.sh            ROUNDS=5 SECONDS_PER_RUN=10 by default
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-5}
duration=${SECONDS_PER_RUN:-10}
scripts/install-deps.sh >/dev/null
make -s && make -s install >/dev/null
build=${BENCH_BUILD_DIR:-build-bench}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target orders-service >/dev/null

work=$(mktemp -d /tmp/idem-httpbench.XXXXXX)
service=""
trap '[[ -n $service ]] && kill "$service" 2>/dev/null; scripts/pgcluster.sh stop "$work/pg"; rm -rf "$work"' EXIT
PGCLUSTER_CONF="fsync = on" scripts/pgcluster.sh start "$work/pg" "${BENCH_PORT:-55460}" >/dev/null
# shellcheck disable=SC1091
source "$work/pg/env"
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE shop"
psql -X -q -v ON_ERROR_STOP=1 -d shop -c "CREATE EXTENSION idempotency"
http_port=$((PGPORT + 1))

start_service() {  # start_service SYNCHRONOUS_COMMIT
  [[ -n $service ]] && kill "$service" 2>/dev/null && wait "$service" 2>/dev/null || true
  psql -X -q -d shop -c "ALTER DATABASE shop SET synchronous_commit = $1"
  "$build"/orders-service --port "$http_port" --threads 8 \
    --dsn "host=$PGHOST port=$PGPORT dbname=shop user=postgres" 2>>"$work/service.log" &
  service=$!
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$http_port/health" >/dev/null && break; sleep 0.1; done
}

rps() {  # rps PATH RUN-ID [CONNECTIONS] -> requests/s
  local c=${3:-8}
  WRK_PATH=$1 WRK_RUN=$2 wrk -t$((c < 2 ? c : 2)) -c"$c" -d"${duration}s" -s bench/http/fresh_keys.lua "http://127.0.0.1:$http_port" \
    2>"$work/wrk.err" | awk '/^Requests\/sec/ { print $2 }'
  if [[ -s $work/wrk.err ]]; then echo "wrk reported: $(sort "$work/wrk.err" | uniq -c | head -3)" >&2; fi
}

# shellcheck source=../lib.sh
source bench/lib.sh  # median

printf '%-18s %-7s %10s %10s %10s %9s %9s\n' "synchronous_commit" "round" "wrapped" "classic" "plain" \
  "wrap/pl" "class/pl"
routes=(/orders /classic/orders /plain/orders)
names=(wrapped classic plain)
for sc in off on; do
  start_service "$sc"
  for i in 0 1 2; do rps "${routes[$i]}" "warm-${names[$i]}-$sc" >/dev/null; done  # connections, caches
  for name in "${names[@]}"; do : >"$work/$name.$sc"; done
  for ((r = 1; r <= rounds; r++)); do
    # Rotate which goes first, so drift does not favour one side.
    declare -A got=()
    for ((j = 0; j < 3; j++)); do
      i=$(((r + j) % 3))
      got[${names[$i]}]=$(rps "${routes[$i]}" "${names[$i]}-$sc-$r-$RANDOM")
      echo "${got[${names[$i]}]}" >>"$work/${names[$i]}.$sc"
    done
    printf '%-18s %-7s %10s %10s %10s %9.3f %9.3f\n' "$sc" "$r" "${got[wrapped]}" "${got[classic]}" "${got[plain]}" \
      "$(echo "${got[wrapped]} / ${got[plain]}" | bc -l)" "$(echo "${got[classic]} / ${got[plain]}" | bc -l)"
  done
  mw=$(median <"$work/wrapped.$sc")
  mc=$(median <"$work/classic.$sc")
  mp=$(median <"$work/plain.$sc")
  printf '%-18s %-7s %10.0f %10.0f %10.0f %9.3f %9.3f   (goal: wrapped >= 0.85 x plain)\n' "$sc" median \
    "$mw" "$mc" "$mp" "$(echo "$mw / $mp" | bc -l)" "$(echo "$mc / $mp" | bc -l)"
  # One client, one request at a time: the time per request, where round trips
  # show directly (medians of the rounds, order rotated as above).
  for name in "${names[@]}"; do : >"$work/$name.$sc.c1"; done
  for ((r = 1; r <= rounds; r++)); do
    for ((j = 0; j < 3; j++)); do
      i=$(((r + j) % 3))
      rps "${routes[$i]}" "${names[$i]}-$sc-c1-$r-$RANDOM" 1 >>"$work/${names[$i]}.$sc.c1"
    done
  done
  us() { echo "1000000 / $(median <"$work/$1.$sc.c1")" | bc -l; }
  printf '%-18s %-7s %10.1f %10.1f %10.1f   (one client: microseconds per request)\n' "$sc" "1 conn" \
    "$(us wrapped)" "$(us classic)" "$(us plain)"
done
psql -X -q -At -d shop -c "SELECT 'orders ' || count(*) FROM orders" \
  -c "SELECT 'keys ' || count(*) FROM idempotency.keys"
if grep -qv 'listening on' "$work/service.log"; then
  echo "the service logged (count, message):"
  grep -v 'listening on' "$work/service.log" | sort | uniq -c | sort -rn | head -5
fi
