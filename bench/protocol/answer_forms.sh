#!/usr/bin/env bash
# Benchmark, run by hand (prints, never asserts): the two shapes of the clients'
# begin statement side by side in one run (issue 40). Since 0.9.0 the Python,
# Node, Go and Rust clients read idempotency.http_answer in begin's statement:
#   lateral  ... FROM idempotency.begin(...) o LEFT JOIN LATERAL
#            (SELECT * FROM idempotency.http_answer(o, ...) WHERE o.outcome <> 'started'
#             OFFSET 0) a ON true                     (one call of http_answer)
#   case     ... , CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, ...)).status
#            END, ... .headers ..., ... .body ... FROM idempotency.begin(...) o
#                                                     (one call per column)
# The lateral shape is one Citus does not delegate (through a coordinator every
# keyed request was refused); the case shape is. This measures what the case
# shape costs on one node: a fresh key (BEGIN, begin, complete, COMMIT; no call
# of http_answer in either) and a replay (begin of a stored key: one call
# against three). One client, pgbench -M prepared, synchronous_commit off,
# rounds interleaved; median latency per shape and the ratio case / lateral.
#
#   bench/protocol/answer_forms.sh       BENCH_ROUNDS=5 BENCH_SECONDS=6 BENCH_PORT=26890
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../lib.sh
source bench/lib.sh
rounds=${BENCH_ROUNDS:-5}
seconds=${BENCH_SECONDS:-6}
port=${BENCH_PORT:-26890}
work=$(mktemp -d /tmp/idem-bench-answer.XXXXXX)
chmod 755 "$work"
trap 'scripts/pgcluster.sh stop "$work/pg" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
PGCLUSTER_PRELOAD=idempotency scripts/pgcluster.sh start "$work/pg" "$port" >/dev/null
dsn="postgresql://postgres@127.0.0.1:$port/postgres"
psql -X -q -v ON_ERROR_STOP=1 "$dsn" >/dev/null <<'SQL'
CREATE EXTENSION idempotency;
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'stored', 'a', idempotency.fingerprint('POST', '/x', '{}'::bytea));
SELECT idempotency.complete('p', 'stored', 201, '{"id":1}'::bytea, '{"Content-Type": "application/json"}'::jsonb);
COMMIT;
SQL
call="idempotency.begin('p', :key, 'a', idempotency.fingerprint('POST', '/x', '{}'::bytea)) AS o"
answer="idempotency.http_answer(o, '/problems/', 1)"
lateral="SELECT o.outcome, a.status, a.headers::text, a.body FROM $call LEFT JOIN LATERAL (SELECT * FROM $answer WHERE o.outcome <> 'started' OFFSET 0) AS a ON true;"
case="SELECT o.outcome, CASE WHEN o.outcome <> 'started' THEN ($answer).status END, CASE WHEN o.outcome <> 'started' THEN ($answer).headers::text END, CASE WHEN o.outcome <> 'started' THEN ($answer).body END FROM $call;"
fresh_key="'k' || :k"
stored_key="'stored'"
for shape in lateral case; do
  statement=${!shape}
  { echo "\\set k random(1, 1000000000000000000)"; echo "BEGIN;"
    echo "${statement//:key/$fresh_key}"
    echo "SELECT idempotency.complete('p', 'k' || :k, 201, '\\x7b7d'::bytea);"; echo "COMMIT;"
  } >"$work/fresh-$shape.sql"
  echo "${statement//:key/$stored_key}" >"$work/replay-$shape.sql"
done
chmod 644 "$work"/*.sql
declare -A latencies
echo "1 client, $seconds s per run, $rounds rounds; pgbench -M prepared, synchronous_commit = off"
for ((r = 1; r <= rounds; r++)); do
  for run in fresh-lateral fresh-case replay-lateral replay-case; do
    out=$(PGOPTIONS="-c synchronous_commit=off" pgbench -n -M prepared -c 1 -T "$seconds" \
      -f "$work/$run.sql" "$dsn" 2>&1) || { echo "$out"; exit 1; }
    ms=$(sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p' <<<"$out")
    latencies[$run]+="$ms"$'\n'
    printf '%-16s round %d  %s ms\n' "$run" "$r" "$ms"
  done
done
echo
for path in fresh replay; do
  l=$(printf '%s' "${latencies[$path-lateral]}" | median)
  c=$(printf '%s' "${latencies[$path-case]}" | median)
  echo "$path: lateral $l ms, case $c ms (median); case / lateral $(ratio "$c" "$l")"
done
