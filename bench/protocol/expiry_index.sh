#!/usr/bin/env bash
# The keyed write with 0.8.0's expiry index against the same write with 0.7.0's,
# in one cluster, interleaved: three databases,
#   bucket   0.8.0 as installed (keys_expiry_bucket_idx: expires_at cut to 10 ms)
#   plain    0.8.0 with that index replaced by 0.7.0's B-tree on expires_at
#   v070     the extension's SQL of 0.7.0 (this build's library)
# and ROUNDS rounds of pgbench (bench/cleanup/protocol.sql: begin, an effect,
# complete, fresh keys) for DURATION s on each, the order rotated each round;
# the tables keep growing across rounds. Prints TPS per round, the medians and
# their ratios to "bucket". Timings are printed, never asserted.
#
#   bench/protocol/expiry_index.sh          ROUNDS (5), DURATION (10), CLIENTS (4)
#
# Its own cluster (scripts/pgcluster.sh, EXPIRY_BENCH_DIR /tmp/expiry-index-bench,
# EXPIRY_BENCH_PORT 27840; fsync on, synchronous_commit off).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../lib.sh
source bench/lib.sh
rounds=${ROUNDS:-5} seconds=${DURATION:-10} clients=${CLIENTS:-4}
dir=${EXPIRY_BENCH_DIR:-/tmp/expiry-index-bench} port=${EXPIRY_BENCH_PORT:-27840}
stop() { scripts/pgcluster.sh stop "$dir" >/dev/null 2>&1 || true; }
trap stop EXIT
stop
rm -rf "$dir"
PGCLUSTER_CONF=$'fsync = on\nsynchronous_commit = off\nmax_wal_size = 4GB' \
  scripts/pgcluster.sh start "$dir" "$port" >/dev/null
# shellcheck disable=SC1091
source "$dir/env"
sql() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }
variants=(bucket plain v070)
for db in "${variants[@]}"; do sql -d postgres -c "CREATE DATABASE $db"; done
sql -d bucket -c "CREATE EXTENSION idempotency"
sql -d plain -c "CREATE EXTENSION idempotency" -c "DROP INDEX idempotency.keys_expiry_bucket_idx" \
  -c "CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at)"
sql -d v070 -c "CREATE EXTENSION idempotency VERSION '0.7.0'"
for db in "${variants[@]}"; do
  sql -d "$db" -c "CREATE TABLE effects (id bigserial PRIMARY KEY, client int, note text)"
done
echo "source: $(git rev-parse --short HEAD); $(sql -d bucket -c 'SHOW server_version'); $rounds rounds x $seconds s, $clients clients"
results=$(mktemp)
trap 'stop; rm -f "$results"' EXIT
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < ${#variants[@]}; i++)); do
    db=${variants[$(((i + r) % ${#variants[@]}))]}
    sql -d "$db" -c "CHECKPOINT"
    out=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$seconds" -f bench/cleanup/protocol.sql "$db" 2>&1) \
      || { echo "$out" >&2; exit 1; }
    tps=$(pgbench_value "$out" tps)
    echo "round $((r + 1)) $db $tps TPS, keys in the table $(sql -d "$db" -c "SELECT count(*) FROM idempotency.keys")"
    echo "$db $tps" >>"$results"
  done
done
base=$(awk '$1 == "bucket" { print $2 }' "$results" | median)
for db in "${variants[@]}"; do
  m=$(awk -v d="$db" '$1 == d { print $2 }' "$results" | median)
  printf '%-7s median %8.0f TPS   / bucket %s\n' "$db" "$m" "$(ratio "$m" "$base")"
done
