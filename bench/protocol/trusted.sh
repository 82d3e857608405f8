#!/usr/bin/env bash
# The trusted edition beside the C++ edition: server CPU per keyed write
# (extension.sql: begin, the effect, complete, in one transaction) and per
# jcs / fingerprint call, one database of each edition in one throwaway
# cluster (library not preloaded; the C++ edition loads it in its own sessions).
#
#   bench/protocol/trusted.sh        # about 4 minutes on 2 cores
#
# Settings: ROUNDS (3), SECONDS_PER_RUN (5), CLIENTS (2), PROTO_PGPORT (55451),
# WHAT ("keyed_write fingerprint jcs").
# Every run is pgbench -n -M prepared -c CLIENTS -j CLIENTS -T SECONDS_PER_RUN,
# the editions alternating; reported: the median over rounds of TPS and of the
# server's CPU (postmaster and children, from /proc) per transaction.
# Timings are printed, never asserted.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-3}
seconds=${SECONDS_PER_RUN:-5}
clients=${CLIENTS:-2}
dir=$(mktemp -d /tmp/idem-trusted-bench.XXXXXX)
trap 'scripts/pgcluster.sh stop "$dir/pg" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
PGCLUSTER_PRELOAD=pg_cron PGCLUSTER_CONF=$'fsync = on\nsynchronous_commit = off\nautovacuum = off' \
  scripts/pgcluster.sh start "$dir/pg" "${PROTO_PGPORT:-55451}" >/dev/null
# shellcheck disable=SC1091
source "$dir/pg/env"
make -s trusted >/dev/null
hz=$(getconf CLK_TCK)
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
for db in cpp trusted; do
  q -c "CREATE DATABASE $db"
  if [[ $db == cpp ]]; then q -d cpp -c "CREATE EXTENSION idempotency"; else
    q -d trusted -f "build/trusted/idempotency--$(cat VERSION).sql"; fi
  q -d "$db" -c "CREATE SCHEMA bench" -c "CREATE TABLE bench.effects (
      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, principal text NOT NULL,
      order_ref text NOT NULL, amount integer NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now())"
done
body='{"order":{"items":[{"sku":"A-1","qty":2,"price":19.99},{"sku":"B-7","qty":1,"price":5.5}],'
body+='"currency":"eur","customer":{"id":"c_42","email":"a@example.com"}},"note":"leave at door"}'
hex=$(printf '%s' "$body" | od -An -tx1 | tr -d ' \n')
cat >"$dir/jcs.sql" <<SQL
\\set n random(1, 1000000)
SELECT idempotency.jcs('{"n":' || :n || ',' || substr(convert_from('\\x$hex'::bytea, 'UTF8'), 2));
SQL
# A parameter in every call: with constant arguments the planner would fold
# the IMMUTABLE call once per prepared statement.
cat >"$dir/fingerprint.sql" <<SQL
\\set n random(1, 1000000)
SELECT idempotency.fingerprint('POST', '/orders/' || :n, '\\x$hex'::bytea);
SQL
cp bench/protocol/extension.sql "$dir/keyed_write.sql"

pg_ticks() {
  local pm
  pm=$(head -1 "$dir/pg/data/postmaster.pid")
  { echo "$pm"; ps -o pid= --ppid "$pm"; } | while read -r p; do
    sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null || true
  done | awk '{s += $12 + $13 + $14 + $15} END {print s + 0}'
}
# run DB SCRIPT: prints "TPS CPU_US_PER_TX"
run() {
  local p0 p1 log="$dir/log"
  q -d "$1" -c "TRUNCATE bench.effects, idempotency.keys" -c "CHECKPOINT"
  p0=$(pg_ticks)
  pgbench -n -M prepared -c "$clients" -j "$clients" -T "$seconds" -f "$dir/$2.sql" "$1" \
    >"$log" 2>&1
  p1=$(pg_ticks)
  if grep -qi -E 'error|aborted' "$log"; then cat "$log" >&2; exit 1; fi
  awk -v p="$((p1 - p0))" -v hz="$hz" '
    /^number of transactions actually processed/ {n = $6}
    /^tps = / {tps = $3}
    END {printf "%.0f %.1f\n", tps, p * 1e6 / hz / n}' "$log"
}
median() {
  sort -n | awk '{v[NR] = $1}
                 END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

echo "cores: $(nproc); $(pgbench --version); rounds: $rounds x ${seconds}s, $clients clients"
printf '| what | edition | TPS (median) | server CPU per call, µs (median) |\n|---|---|---|---|\n'
for what in ${WHAT:-keyed_write fingerprint jcs}; do
  for db in cpp trusted; do run "$db" "$what" >/dev/null; done  # warm-up
  : >"$dir/cpp.$what"
  : >"$dir/trusted.$what"
  for _ in $(seq "$rounds"); do
    for db in cpp trusted; do run "$db" "$what" >>"$dir/$db.$what"; done
  done
  for db in cpp trusted; do
    printf '| %s | %s | %s | %s |\n' "$what" "$db" "$(cut -d' ' -f1 "$dir/$db.$what" | median)" \
      "$(cut -d' ' -f2 "$dir/$db.$what" | median)"
  done
done
