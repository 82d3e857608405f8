#!/usr/bin/env bash
# Cleanup under load: 1,000,000 expired keys are deleted with
# CALL idempotency.cleanup() while pgbench runs the transactional protocol with
# fresh keys at a fixed rate (-R) of half the rate it reaches alone. Reports
# cleanup rows/s and the protocol's p50/p99 latency without and with cleanup
# running (same duration, same table size), per round and as medians over
# ROUNDS rounds (each: load the expired keys, a baseline run, a run with
# cleanup, VACUUM).
#
#   bench/cleanup/run.sh     EXPIRED=1000000 BATCH=10000 PAUSE=0 ROUNDS=3 by default
#   EXTRA_CONF=$'shared_buffers = 1GB' bench/cleanup/run.sh    more postgresql.conf lines
#   SETUP_SQL='...' bench/cleanup/run.sh     SQL run in the bench database after CREATE EXTENSION
#   EXT_VERSION=0.7.0 bench/cleanup/run.sh   the extension's SQL of that release (this build's library)
#
# Per round it also prints the p99 of the run with cleanup before cleanup
# started and after it ended (the same pgbench run and connections, so
# machine-level drift between two runs does not enter that ratio), and what the
# run with cleanup cost the server, from
# pg_stat_wal and pg_stat_bgwriter: WAL bytes, full-page images, WAL writes and
# syncs, how often the WAL buffers were full, and the buffers written by
# backends (a backend that must evict a dirty page first flushes the WAL up to
# that page's LSN).
set -euo pipefail
cd "$(dirname "$0")/../.."
expired=${EXPIRED:-1000000}
batch=${BATCH:-10000}
pause=${PAUSE:-0}
scripts/install-deps.sh >/dev/null
make -s && make -s install >/dev/null

work=$(mktemp -d /tmp/idem-cleanupbench.XXXXXX)
chmod 755 "$work"
trap 'scripts/pgcluster.sh stop "$work/pg"; rm -rf "$work"' EXIT
PGCLUSTER_CONF=$'fsync = on\nsynchronous_commit = off\nmax_wal_size = 4GB\n'"${EXTRA_CONF:-}" \
  scripts/pgcluster.sh start "$work/pg" "${BENCH_PORT:-55470}" >/dev/null
# shellcheck disable=SC1091
source "$work/pg/env"
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE bench"
version_clause=
[[ -z ${EXT_VERSION:-} ]] || version_clause=" VERSION '$EXT_VERSION'"
psql -X -q -v ON_ERROR_STOP=1 -d bench -c "CREATE EXTENSION idempotency$version_clause" \
  -c "CREATE TABLE effects (id bigserial PRIMARY KEY, client int, note text)"
if [[ -n ${SETUP_SQL:-} ]]; then
  psql -X -q -v ON_ERROR_STOP=1 -d bench -c "$SETUP_SQL"
fi
script=$(pwd)/bench/cleanup/protocol.sql
bench() { pgbench -n -M prepared -c 4 -j 2 -f "$script" bench "$@"; }

echo "== rate alone"
max=$(bench -T 15 2>/dev/null | awk '/^tps/ { print int($3) }')
rate=$((max / 2))
echo "extension $(psql -X -At -d bench -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"); max ${max} tps; fixed rate for the runs: ${rate} tps"

# Autovacuum stays off for the two bench tables, so it never falls into a
# measured run; every round ends with a VACUUM instead.
psql -X -q -v ON_ERROR_STOP=1 -d bench -c "ALTER TABLE idempotency.keys SET (autovacuum_enabled = off)" \
  -c "ALTER TABLE effects SET (autovacuum_enabled = off)"

load_expired() {
  psql -X -q -v ON_ERROR_STOP=1 -d bench -c "
    INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, response_body,
                                  created_at, expires_at)
    SELECT 'old', 'key-' || i, 'create_order', decode(repeat('00', 32), 'hex'), 'completed', 201,
           convert_to('{\"id\":' || i || '}', 'UTF8'),
           now() - interval '3 days', now() - interval '2 days' + (i % 86400) * interval '1 second'
      FROM generate_series(1, $expired) AS i" -c "VACUUM ANALYZE idempotency.keys" -c "CHECKPOINT"
}

# percentiles LOGDIR FROM TO: p50 and p99 latency (ms) of transactions that started in [FROM, TO) (epoch s)
percentiles() {
  cat "$1"/pgbench_log.* | awk -v from="$2" -v to="$3" '{ t = $5 + $6 / 1e6; if (t >= from && t < to) print $3 / 1000 }' |
    sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) { print "n/a n/a 0"; exit }
      printf "%.3f %.3f %d\n", a[int(NR * 0.50) + 1], a[int(NR * 0.99) + 1], NR }'
}
# first_second LOGDIR: when the run's first logged transaction started (epoch s)
first_second() { awk '{ print $5; exit }' "$1"/pgbench_log.*; }
# shellcheck source=../lib.sh
source bench/lib.sh  # median

# server_stats: one line of cumulative counters (pg_stat_wal, pg_stat_bgwriter)
server_stats() {
  psql -X -q -At -F ' ' -d bench -c "
    SELECT w.wal_bytes, w.wal_fpi, w.wal_write, w.wal_sync, w.wal_buffers_full,
           b.buffers_backend, b.buffers_clean, b.buffers_checkpoint, b.checkpoints_timed + b.checkpoints_req
      FROM pg_stat_wal AS w, pg_stat_bgwriter AS b"
}
# stats_delta BEFORE AFTER: the counters' differences, labelled
stats_delta() {
  paste -d ' ' <(tr ' ' '\n' <<<"$1") <(tr ' ' '\n' <<<"$2") | awk '{ d[NR] = $2 - $1 } END {
    printf "       server while cleanup ran: WAL %.1f MB, %d FPI, %d WAL writes, %d WAL syncs, WAL buffers full %d, buffers written by backends %d / bgwriter %d / checkpointer %d, checkpoints %d\n",
      d[1] / 1048576, d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9] }'
}

duration=${DURATION:-40}
rounds=${ROUNDS:-3}
printf '%-6s %10s %9s %16s %16s %9s\n' round deleted rows/s "base p50/p99" "cleanup p50/p99" "p99 ratio"
for ((r = 1; r <= rounds; r++)); do
  load_expired
  # Baseline: the middle of a run at the fixed rate, no cleanup.
  rm -rf "$work/base" && mkdir -p "$work/base"
  (cd "$work/base" && bench -R "$rate" -T "$duration" -l >/dev/null 2>&1)
  start=$(($(first_second "$work/base") + 10))
  read -r base_p50 base_p99 _ <<<"$(percentiles "$work/base" "$start" "$((start + duration - 15))")"
  # The same with CALL idempotency.cleanup() starting after 10 s: the transactions
  # that started while it ran.
  rm -rf "$work/load" && mkdir -p "$work/load"
  (cd "$work/load" && bench -R "$rate" -T "$duration" -l >/dev/null 2>&1) &
  load=$!
  sleep 10
  stats_before=$(server_stats)
  c_start=$(date +%s.%N)
  deleted=$(psql -X -q -At -d bench -c "CALL idempotency.cleanup(batch_size => $batch, pause => '${pause} ms')")
  c_end=$(date +%s.%N)
  stats_after=$(server_stats)
  wait "$load"
  read -r load_p50 load_p99 _ <<<"$(percentiles "$work/load" "$c_start" "$c_end")"
  # The same run's own windows without cleanup: from 3 s after its start until
  # cleanup began, and from cleanup's end to the end of the run.
  l_first=$(first_second "$work/load")
  read -r pre_p50 pre_p99 _ <<<"$(percentiles "$work/load" "$((l_first + 3))" "$c_start")"
  read -r post_p50 post_p99 _ <<<"$(percentiles "$work/load" "$c_end" "$((l_first + duration))")"
  seconds=$(echo "$c_end - $c_start" | bc -l)
  rows=$(echo "$deleted / $seconds" | bc -l)
  ratio=$(echo "$load_p99 / $base_p99" | bc -l)
  inrun=$(echo "$load_p99 / $pre_p99" | bc -l)
  printf '%-6s %10s %9.0f %16s %16s %9.2f\n' "$r" "$deleted" "$rows" "$base_p50/$base_p99" "$load_p50/$load_p99" "$ratio"
  printf '       same run without cleanup: before p50/p99 %s/%s ms, after %s/%s ms; p99 while cleanup ran / before %.2f\n' \
    "$pre_p50" "$pre_p99" "$post_p50" "$post_p99" "$inrun"
  echo "$inrun" >>"$work/inrun"
  stats_delta "$stats_before" "$stats_after"
  echo "$rows" >>"$work/rows"; echo "$base_p50" >>"$work/bp50"; echo "$base_p99" >>"$work/bp99"
  echo "$load_p50" >>"$work/lp50"; echo "$load_p99" >>"$work/lp99"; echo "$ratio" >>"$work/ratio"
  if (( $(echo "$seconds > $duration - 12" | bc -l) )); then
    echo "note: cleanup outlasted the load run; raise DURATION"
  fi
  psql -X -q -d bench -c "VACUUM idempotency.keys" -c "VACUUM effects" -c "CHECKPOINT"
done
printf '\n%-34s %s (batch %s, pause %s ms)\n' "expired keys per round" "$expired" "$batch" "$pause"
printf '%-34s %.0f rows/s (goal >= 50000)\n' "cleanup, median" "$(median <"$work/rows")"
printf '%-34s %s tps (max %s)\n' "protocol rate (pgbench -R)" "$rate" "$max"
printf '%-34s p50 %s ms, p99 %s ms\n' "latency without cleanup, median" "$(median <"$work/bp50")" "$(median <"$work/bp99")"
printf '%-34s p50 %s ms, p99 %s ms\n' "latency while cleanup runs, median" "$(median <"$work/lp50")" "$(median <"$work/lp99")"
printf '%-34s %.2f (median of the rounds; goal <= 1.20)\n' "p99 ratio" "$(median <"$work/ratio")"
printf '%-34s %.2f (p99 while cleanup ran / p99 before it in the same run, median of the rounds)\n' "in-run p99 ratio" "$(median <"$work/inrun")"
