#!/usr/bin/env bash
# Many keys in one call against one call per key (issue 25, part 2): on one
# connection (pgbench, 1 client, prepared statements), a transaction that
# begins and completes 100 fresh keys, either with 100 idempotency.begin() +
# 100 idempotency.complete() calls or with one begin_batch() + one
# complete_batch() over the same 100 keys. Same transaction shape (BEGIN, the
# calls, COMMIT), same keys, fingerprint, status and body. Rounds alternate the
# two, on an emptied key table each; prints keys/s per round, the medians and
# their ratio (the goal: batch >= 5x single), the server CPU per key of each
# (steadier than keys/s on a loaded machine), with the load average before and
# after. Needs the extension installed in the server of PGBIN.
#
#   bench/batch/run.sh                      # 5 rounds of 10 s each way (ROUNDS, SECONDS_PER_ROUND)
#   PGBIN=/path/to/postgresql/bin bench/batch/run.sh     PORT (default 27701)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/bench/lib.sh"
rounds=${ROUNDS:-5}
seconds=${SECONDS_PER_ROUND:-10}
keys=${KEYS:-100}
port=${PORT:-27701}
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
export PGBIN

dir=$(mktemp -d /tmp/idem-batch-bench.XXXXXX)
trap '"$root/scripts/pgcluster.sh" stop "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
"$root/scripts/pgcluster.sh" start "$dir/pg" "$port" >/dev/null
source "$dir/pg/env"
psql -qX -v ON_ERROR_STOP=1 -c "CREATE EXTENSION idempotency" >/dev/null

# The scripts: :k is a fresh random prefix per transaction; key i is :k || '-i'.
fp="'\\xaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'::bytea"
body="'\\x6f6b'::bytea"
{
  echo '\set k random(1, 1000000000000000)'
  echo 'BEGIN;'
  for i in $(seq 1 "$keys"); do
    echo "SELECT outcome FROM idempotency.begin('bench', :k || '-$i', 'consume', $fp);"
    echo "SELECT idempotency.complete('bench', :k || '-$i', 200, $body);"
  done
  echo 'COMMIT;'
} >"$dir/single.sql"
array=$(for i in $(seq 1 "$keys"); do printf ":k || '-%d'," "$i"; done)
{
  echo '\set k random(1, 1000000000000000)'
  echo 'BEGIN;'
  echo "SELECT count(*) FROM idempotency.begin_batch('bench', ARRAY[${array%,}], 'consume'," \
       "array_fill($fp, ARRAY[$keys])) WHERE outcome = 'started';"
  echo "SELECT count(*) FROM idempotency.complete_batch('bench', ARRAY[${array%,}]," \
       "array_fill(200, ARRAY[$keys]), array_fill($body, ARRAY[$keys]));"
  echo 'COMMIT;'
} >"$dir/batch.sql"

run() {  # script -> "keys/s server-CPU-µs-per-key"
  psql -qX -c "TRUNCATE idempotency.keys" -c "CHECKPOINT" >/dev/null
  local out tps before after transactions
  before=$(cpu_ticks "$dir/pg")
  out=$("$PGBIN/pgbench" -n -c 1 -j 1 -M prepared -T "$seconds" -f "$dir/$1.sql" 2>&1) \
    || { echo "$out" >&2; exit 1; }
  sleep 0.2  # the benchmark's backend has exited and been reaped: its CPU is the postmaster's cutime
  after=$(cpu_ticks "$dir/pg")
  [[ $(pgbench_value "$out" failed) == "" || $(pgbench_value "$out" failed) == 0 ]] \
    || { echo "$out" >&2; exit 1; }
  tps=$(pgbench_value "$out" tps)
  transactions=$(pgbench_value "$out" transactions)
  echo "$(echo "scale=0; $tps * $keys / 1" | bc)" \
       "$(echo "scale=1; ($after - $before) * 1000000 / $(getconf CLK_TCK) / ($transactions * $keys)" | bc)"
}

# The stored rows are the same either way (checked once, on a small run).
psql -qX -v ON_ERROR_STOP=1 -c "TRUNCATE idempotency.keys" >/dev/null
"$PGBIN/pgbench" -n -c 1 -t 2 -M prepared -f "$dir/single.sql" >/dev/null
"$PGBIN/pgbench" -n -c 1 -t 2 -M prepared -f "$dir/batch.sql" >/dev/null
psql -qXAt -c "SELECT 'rows stored by 2 transactions of each: ' || count(*) || ' (' ||
                      string_agg(DISTINCT state || ' ' || response_status || ' ' || response_body::text, ', ') || ')'
                 FROM idempotency.keys"

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min); $(nproc) cores"
echo "round  single keys/s  batch keys/s  ratio  | server CPU µs per key: single  batch"
singles=() batches=() single_cpu=() batch_cpu=()
for r in $(seq 1 "$rounds"); do
  read -r s sc <<<"$(run single)"
  read -r b bc <<<"$(run batch)"
  singles+=("$s") batches+=("$b") single_cpu+=("$sc") batch_cpu+=("$bc")
  printf '%5d  %13d  %12d  %5s  | %30s  %5s\n' "$r" "$s" "$b" "$(ratio "$b" "$s")" "$sc" "$bc"
done
ms=$(printf '%s\n' "${singles[@]}" | median)
mb=$(printf '%s\n' "${batches[@]}" | median)
msc=$(printf '%s\n' "${single_cpu[@]}" | median)
mbc=$(printf '%s\n' "${batch_cpu[@]}" | median)
echo "median single: $ms keys/s, $msc µs server CPU per key ($keys begin + $keys complete calls per transaction)"
echo "median batch:  $mb keys/s, $mbc µs server CPU per key (1 begin_batch + 1 complete_batch of $keys keys)"
echo "ratio (median batch / median single): $(ratio "$mb" "$ms") keys/s (goal >= 5), $(ratio "$msc" "$mbc") server CPU"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
