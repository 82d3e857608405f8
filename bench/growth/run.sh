#!/usr/bin/env bash
# The keyed write as the key table grows: for each size in SIZES the table
# idempotency.keys is pre-filled with that many live completed keys, then
# pgbench rounds interleave the keyed write (bench/protocol/extension.sql)
# with the same write without a key (bench/protocol/base.sql) and a replay
# lookup (begin of an existing key). See bench/growth/README.md.
#
#   bench/growth/run.sh                          SIZES="0 10000000 50000000"
#   SIZES="0 1000000" ROUNDS=3 DURATION=10 bench/growth/run.sh     a quick check
#   SCHEMA_SQL=bench/growth/brin.sql bench/growth/run.sh      a candidate schema change
#
# Environment: SIZES, ROUNDS (5), DURATION (20 s a round), WARMUP (3), BODY_BYTES (200),
# TENANTS (1000), CLIENTS (4), JOBS (2), SYNC_COMMIT (off), FPW (on:
# full_page_writes), BATCH (1000000 rows per fill statement), SCHEMA_SQL (a
# file run after CREATE EXTENSION, before the fill), PGBIN (default: the server
# of PG_CONFIG or pg_config), EXTRA_CONF (more postgresql.conf lines, e.g.
# 'wal_compression = lz4'), GROW_DIR (/tmp/grow-bench), GROW_PORT (27800),
# HEAP_FILLFACTOR (the key table's fillfactor for the run), RESULTS
# (bench/growth/results), CLEANUP_KEYS (a tenth of the last size: expired keys deleted
# by cleanup() and VACUUM at the end, cost per row), FILL_INDEXES (during: the
# fill inserts through both indexes; after: they are dropped for the fill and
# built again after it, with INDEX_FILLFACTOR (74), for sizes whose fill would
# take hours - see README.md), KEYS (random; ordered: each new key above every
# stored one, as time-ordered keys are - see README.md).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../lib.sh
source "$root/bench/lib.sh"
read -r -a sizes <<<"${SIZES:-0 10000000 50000000}"
rounds=${ROUNDS:-5} seconds=${DURATION:-20} warmup=${WARMUP:-3}
body=${BODY_BYTES:-200} tenants=${TENANTS:-1000} batch=${BATCH:-1000000}
clients=${CLIENTS:-4} jobs=${JOBS:-2}
dir=${GROW_DIR:-/tmp/grow-bench} port=${GROW_PORT:-27800}
results=${RESULTS:-$here/results}
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
ordered=false
[[ ${KEYS:-random} == ordered ]] && ordered=true
[[ ${KEYS:-random} =~ ^(random|ordered)$ ]] || { echo "KEYS must be random or ordered" >&2; exit 2; }
# FILL_INDEXES=after: the fill goes into the heap alone, then both indexes are
# built again from their own definitions, their leaves filled to INDEX_FILLFACTOR
# percent: 74 is how full the leaves of an index grown by random inserts were
# (64 bytes per key in the primary key at 10M keys filled through it), so the
# measured inserts meet leaves as full as in a table grown one key at a time.
indexes_after=false
[[ ${FILL_INDEXES:-during} == after ]] && indexes_after=true
[[ ${FILL_INDEXES:-during} =~ ^(during|after)$ ]] \
  || { echo "FILL_INDEXES must be during or after" >&2; exit 2; }
hz=$(getconf CLK_TCK)

rm -rf "$results" && mkdir -p "$results/logs" "$results/scripts"
stop() { "$root/scripts/pgcluster.sh" stop "$dir" >/dev/null 2>&1 || true; }
trap stop EXIT
stop
PGCLUSTER_CONF="fsync = on
full_page_writes = ${FPW:-on}
synchronous_commit = ${SYNC_COMMIT:-off}
shared_buffers = 1GB
max_wal_size = 4GB
checkpoint_timeout = 30min
${EXTRA_CONF:-}" "$root/scripts/pgcluster.sh" start "$dir" "$port"
# shellcheck disable=SC1091
source "$dir/env"
export PGDATABASE=growth
sql() { "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
sql -d postgres -c "CREATE DATABASE growth"
sql -c "CREATE EXTENSION idempotency" -c "CREATE EXTENSION pg_walinspect" \
  -f "$root/bench/protocol/setup.sql"
[[ -n ${SCHEMA_SQL:-} ]] && sql -f "$SCHEMA_SQL"
# HEAP_FILLFACTOR (e.g. 95), set after each fill: the measured rows go only to pages
# with that much room, not into the few hundred bytes every filled page has left
# (see README.md).
set_fillfactor() {
  [[ -z ${HEAP_FILLFACTOR:-} ]] || sql -c "ALTER TABLE idempotency.keys SET (fillfactor = $1)"
}
set_fillfactor "${HEAP_FILLFACTOR:-}"
# No autovacuum inside a round: each size ends its fill with VACUUM ANALYZE.
sql -c "ALTER TABLE idempotency.keys SET (autovacuum_enabled = off)" \
  -c "ALTER TABLE bench.effects SET (autovacuum_enabled = off)"
{
  echo "source: $(git -C "$root" rev-parse --short HEAD) (PGBIN $PGBIN); cores: $(nproc)"
  echo "sizes: ${sizes[*]}; rounds: $rounds x $seconds s; body: $body bytes; tenants: $tenants"
  printf 'pgbench -n -M prepared -c %s -j %s; keys: %s; schema: %s%s; indexes: %s\n' \
    "$clients" "$jobs" "${KEYS:-random}" \
    "${SCHEMA_SQL:-as installed}" "${HEAP_FILLFACTOR:+, fillfactor $HEAP_FILLFACTOR}" \
    "$($indexes_after && echo "built after the fill, fillfactor ${INDEX_FILLFACTOR:-74}" \
      || echo "filled through")"
  sql -c "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings
    WHERE name IN ('fsync', 'full_page_writes', 'synchronous_commit', 'shared_buffers',
                   'max_wal_size', 'server_version')"
} | tee "$results/setup.txt"

# The protocol's scripts, reused: each request's principal is one of the
# tenants at random (not always 'acme'), so that new keys land anywhere in
# the primary key as they do in production. KEYS=ordered: each fresh key is
# above every key stored before it (a per-client counter over a per-run base,
# see run()), as time-ordered keys (UUIDv7, ULID) are; the same arithmetic in
# both scripts.
ordered_key='\\set n :n + 1\n\\set k 1000000000000000000 + :fresh + :n * '"$clients"' + :client_id'
for v in extension base; do
  { echo "\\set t random(0, $((tenants - 1)))"; sed "s/'acme'/('tenant_' || :t::int)/" \
    "$root/bench/protocol/$v.sql"; } >"$results/scripts/$v.sql"
  if $ordered; then
    sed -i "s/^\\\\set k random(1, 4000000000000000000)\$/$ordered_key/" "$results/scripts/$v.sql"
    grep -q ':fresh' "$results/scripts/$v.sql" || { echo "!! no key line in $v.sql" >&2; exit 1; }
  fi
done
sha="'\\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea"
# Key number I of the fill (SQL of I): a number in 1..4*10^18 as text from a hash of I,
# drawn like the protocol scripts' fresh keys (random(1, 4000000000000000000)) so that
# new keys land among the stored ones at random, as in production (UUID-like keys
# would put the fresh numeric keys in the few leaves of the keys that start with a
# digit).
# KEYS=ordered: key number I is 10^18 + I, 19 digits, so that text order is the
# order of I (the order the fill stored them in).
key_of() {
  if $ordered; then echo "(1000000000000000000 + $1::bigint)::text"; return; fi
  echo "((hashtextextended($1::text, 0) & 9223372036854775807) % 4000000000000000000 + 1)::text"
}
# The lookup: begin of a key the fill stored (key number i of tenant i % TENANTS).
lookup_script() {
  local rest="'create_order', $sha);"
  printf '%s\n' "\\set i random(1, $1)" "\\set p :i % $tenants" \
    "SELECT outcome FROM idempotency.begin('tenant_' || :p::int, $(key_of ':i'), $rest" \
    >"$results/scripts/lookup.sql"
}

# The key table's primary key and other indexes as the installed schema made them
# (the statements that build them again), read before drop_indexes.
pkey_sql= index_sql=
drop_indexes() {
  local ff=${INDEX_FILLFACTOR:-74}
  pkey_sql=$(sql -c "SELECT format('ALTER TABLE idempotency.keys ADD CONSTRAINT %I %s
      WITH (fillfactor = $ff)', conname, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE conrelid = 'idempotency.keys'::regclass AND contype = 'p'")
  index_sql=$(sql -c "SELECT string_agg(pg_get_indexdef(indexrelid) || ' WITH (fillfactor = $ff)',
      '; ') FROM pg_index WHERE indrelid = 'idempotency.keys'::regclass AND NOT indisprimary")
  [[ -n $pkey_sql && -n $index_sql ]] || { echo "!! key table indexes not found" >&2; exit 1; }
  sql -c "$(sql -c "SELECT string_agg(s, '; ') FROM (
      SELECT format('ALTER TABLE idempotency.keys DROP CONSTRAINT %I', conname) AS s
        FROM pg_constraint WHERE conrelid = 'idempotency.keys'::regclass AND contype = 'p'
      UNION ALL SELECT format('DROP INDEX %s', indexrelid::regclass)
        FROM pg_index WHERE indrelid = 'idempotency.keys'::regclass AND NOT indisprimary) AS d")"
}
build_indexes() {
  sql -c "SET maintenance_work_mem = '1GB'" -c "$pkey_sql" -c "$index_sql"
  printf '  built the indexes again (%s)\n' "$(date -u +%T)"
}

# fill FROM TO [EXPIRES]: key numbers FROM..TO, BODY_BYTES of JSON each, expiring
# at EXPIRES: by default 3 to 24 h from now at random (none expires during the
# run, so each lookup is a replay).
fill() {
  local lo=$1 hi=$(($1 + batch - 1))
  local e=${3:-"now() + interval '3 hours' + random() * interval '21 hours'"}
  while ((lo <= $2)); do ((hi > $2)) && hi=$2
    sql -c "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state,
        response_status, response_headers, response_body, resource_id, created_at, expires_at)
      SELECT 'tenant_' || i % $tenants, $(key_of i), 'create_order', $sha, 'completed', 201,
             '{\"content-type\": \"application/json\"}',
             convert_to(rpad('{\"id\":\"ord_' || i || '\",\"status\":\"created\",\"pad\":\"',
                             $body - 2, md5(i::text)) || '\"}', 'UTF8'),
             'ord_' || i, e - interval '24 hours', e
        FROM (SELECT i, $e AS e
                FROM generate_series($lo, $hi) AS i) AS s"
    printf '  filled %d keys (%s)\n' "$hi" "$(date -u +%T)"
    lo=$((hi + 1)) hi=$((lo + batch - 1))
  done
}

# Buffer hits and reads of the key table, its TOAST and each index so far, as
# name:hits:reads:name:hits:reads:...
statio() {
  sql -F : -c "SELECT 'heap', heap_blks_hit, heap_blks_read, 'toast', coalesce(toast_blks_hit, 0),
      coalesce(toast_blks_read, 0) FROM pg_statio_user_tables
      WHERE relid = 'idempotency.keys'::regclass" \
    -c "SELECT indexrelname, idx_blks_hit, idx_blks_read FROM pg_statio_user_indexes
      WHERE relid = 'idempotency.keys'::regclass ORDER BY 1" | tr '\n' :
}

# Full-page images written to the WAL so far (pg_stat_wal).
fpi() { sql -c "SELECT wal_fpi FROM pg_stat_wal"; }

# Waits until no other client backend is left: an exiting backend's CPU ticks are in
# neither its /proc entry nor the postmaster's cutime until the postmaster reaps it.
backends_gone() {
  local q="SELECT count(*) FROM pg_stat_activity
    WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
  while [[ $(sql -c "$q") != 0 ]]; do sleep 0.2; done
  sleep 0.5
}

# run SIZE ROUND VARIANT SECONDS: one pgbench run; a line of raw.tsv.
run() {
  local log="$results/logs/$1-$2-$3.log" c0 c1 l0 l1 f0 f1 s0 s1 w out
  # At size 0 every run starts from an empty table (the keys of earlier runs gone).
  if (($1 == 0)); then sql -c "TRUNCATE idempotency.keys"; fi
  sql -c "CHECKPOINT"
  s0=$(statio); l0=$(sql -c "SELECT pg_current_wal_lsn()"); f0=$(fpi); c0=$(cpu_ticks "$dir")
  # KEYS=ordered: this run's fresh keys start at the time in seconds x 10^8, above the
  # fill's keys (at most 10^8 of them) and every earlier run's (fewer than 10^8 a run).
  "$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$jobs" -T "$4" -f "$results/scripts/$3.sql" \
    -D n=0 -D fresh=$(($(date +%s) * 100000000)) \
    >"$log" 2>&1 || { echo "!! pgbench failed: $log" >&2; tail -5 "$log" >&2; exit 1; }
  backends_gone
  c1=$(cpu_ticks "$dir"); l1=$(sql -c "SELECT pg_current_wal_lsn()"); f1=$(fpi)
  sleep 0.5 # the exited backends' statistics
  s1=$(statio)
  # What the WAL of the run was, by resource manager: rmgr:records:fpi_bytes:bytes:...
  # (15's pg_walinspect has no FPI count: bytes of records and of full-page images.)
  w=$(sql -c "SELECT string_agg(\"resource_manager/record_type\" || ':' || count || ':' || fpi_size
      || ':' || combined_size, ':') FROM pg_get_wal_stats('$l0', '$l1') WHERE count > 0
      AND '$l1'::pg_lsn > '$l0'")
  out=$(<"$log")
  [[ $(pgbench_value "$out" failed) == "" || $(pgbench_value "$out" failed) == 0 ]] \
    || { echo "!! failed transactions: $log" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" \
    "$(pgbench_value "$out" tps)" "$(pgbench_value "$out" transactions)" "$((c1 - c0))" \
    "$(sql -c "SELECT pg_wal_lsn_diff('$l1', '$l0')")" \
    "$((f1 - f0))" \
    "$(cut -d' ' -f1 /proc/loadavg)" "$s0" "$s1" "$w"
}

printf '%s\t' size round variant tps tx cpu_ticks wal_bytes wal_fpi load1 statio_before \
  statio_after >"$results/raw.tsv"
echo wal_by_rmgr >>"$results/raw.tsv"
printf 'size\trows\theap\ttoast\tindexes\n' >"$results/sizes.tsv"
filled=0
for size in "${sizes[@]}"; do
  echo "== $size keys ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
  if ((size > filled)); then
    set_fillfactor 100
    $indexes_after && drop_indexes
    fill $((filled + 1)) "$size"
    $indexes_after && build_indexes
    set_fillfactor "${HEAP_FILLFACTOR:-}"
  fi
  filled=$((size > filled ? size : filled))
  sql -c "TRUNCATE bench.effects" -c "VACUUM ANALYZE idempotency.keys" -c "CHECKPOINT"
  sql -F $'\t' -c "SELECT $size, (SELECT count(*) FROM idempotency.keys), pg_relation_size(c.oid),
      coalesce(pg_relation_size(NULLIF(c.reltoastrelid, 0)), 0),
      (SELECT string_agg(i.relname || '=' || pg_relation_size(i.oid), ',' ORDER BY i.relname)
         FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = c.oid)
      FROM pg_class c WHERE c.oid = 'idempotency.keys'::regclass" | tee -a "$results/sizes.tsv"
  variants=(extension base)
  if ((filled > 0)); then
    lookup_script "$filled"
    out=$(sql -c "SELECT outcome
      FROM idempotency.begin('tenant_1', $(key_of 1), 'create_order', $sha)")
    [[ $out == replay ]] || { echo "!! key 1 of the fill is not a replay: $out" >&2; exit 1; }
    variants+=(lookup)
  fi
  for v in "${variants[@]}"; do run "$size" 0 "$v" "$warmup" >/dev/null; done
  for ((r = 1; r <= rounds; r++)); do
    for ((i = 0; i < ${#variants[@]}; i++)); do
      v=${variants[$(((i + r) % ${#variants[@]}))]}
      run "$size" "$r" "$v" "$seconds" | tee -a "$results/raw.tsv" | cut -f1-9
    done
  done
done
# Cleanup at the last size: CLEANUP_KEYS expired keys (default a tenth of the
# live ones) deleted by idempotency.cleanup() in batches of 500, then VACUUM.
expired=${CLEANUP_KEYS:-$((filled / 10))}
if ((expired > 0)); then
  echo "== cleanup of $expired expired keys among $filled live ($(date -u +%T))"
  fill $((filled + 1)) $((filled + expired)) \
    "now() - interval '1 minute' - random() * interval '23 hours'" | tail -1
  sql -c "VACUUM ANALYZE idempotency.keys" -c "CHECKPOINT"
  printf 'step\trows\tseconds\tcpu_ticks\twal_bytes\twal_fpi\tload1\n' >"$results/cleanup.tsv"
  for step in "CALL idempotency.cleanup(batch_size => 500)" "VACUUM idempotency.keys"; do
    l0=$(sql -c "SELECT pg_current_wal_lsn()"); f0=$(fpi); c0=$(cpu_ticks "$dir"); t0=$(date +%s.%N)
    sql -c "$step" >/dev/null
    t1=$(date +%s.%N)
    backends_gone
    c1=$(cpu_ticks "$dir"); f1=$(fpi); l1=$(sql -c "SELECT pg_current_wal_lsn()")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${step%% *}" "$expired" "$(echo "$t1 - $t0" | bc)" \
      "$((c1 - c0))" "$(sql -c "SELECT pg_wal_lsn_diff('$l1', '$l0')")" "$((f1 - f0))" \
      "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$results/cleanup.tsv"
  done
  left=$(sql -c "SELECT count(*) FROM idempotency.keys WHERE expires_at <= now()")
  ((left == 0)) || { echo "!! $left expired keys left after cleanup" >&2; exit 1; }
fi
python3 "$here/summary.py" "$results" "$hz" | tee "$results/summary.md"
