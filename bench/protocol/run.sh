#!/usr/bin/env bash
# Transactional protocol benchmark: the extension's begin/complete against a
# PL/pgSQL peer, plain SQL ("ideal"), round trips alone ("floor") and no key
# at all ("base"), with pgbench, in one command:
#
#   bench/protocol/run.sh
#
# Starts a throwaway cluster with fsync = on (scripts/pgcluster.sh; PROTO_PGDIR,
# default /tmp/protobench, PROTO_PGPORT, default 55450), installs the
# extension, bench/protocol/setup.sql and plpgsql_peer.sql, checks that the
# extension and the peer answer alike (check.sql), then for synchronous_commit
# off and on: one untimed warm-up run of every variant (WARMUP s), then ROUNDS
# interleaved rounds (order rotated each round) of every variant for DURATION s:
#   pgbench -n -M prepared -c 4 -j 2 -T DURATION -f <variant>.sql
# Every run starts from empty tables (TRUNCATE of all bench tables, then
# CHECKPOINT, so no checkpoint falls inside a run). Then, for each variant, a
# fixed-count run (-t STAT_TX per client) for per-request WAL bytes and
# records and, in the key tables, n_tup_ins/upd/hot_upd/del and n_dead_tup.
# Autovacuum is disabled on the bench tables (reloption) so that dead tuples
# stay counted. Prints medians and ratios, and the server's CPU time per
# transaction; everything lands in bench/protocol/results/ (raw.tsv,
# attempts.tsv, stats.tsv, pgbench logs, summary.md).
#
# Each run also records how much CPU the rest of the machine (any process but
# this cluster, pgbench and kernel threads) used meanwhile ("other CPU"); a run
# with more than OTHER_MAX % (default 10) of the machine used by others is
# repeated, at most RETRIES (default 2) times, and the last attempt is kept.
#
# Environment: ROUNDS (10), DURATION (5), WARMUP (2), CLIENTS (4), JOBS (2),
# STAT_TX (2000), SETTINGS ("off on"), RESULTS (bench/protocol/results),
# VARIANTS ("base floor ideal extension plpgsql"; the diagnostic variants
# extension_noset, ideal_upsert and extension_distributed can be added, see README.md), OTHER_MAX (10),
# RETRIES (2). Needs python3 for the summary.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rounds=${ROUNDS:-10}
duration=${DURATION:-5}
warmup=${WARMUP:-2}
clients=${CLIENTS:-4}
jobs=${JOBS:-2}
stat_tx=${STAT_TX:-2000}
other_max=${OTHER_MAX:-10}
retries=${RETRIES:-2}
settings=${SETTINGS:-"off on"}
pgdir=${PROTO_PGDIR:-/tmp/protobench}
pgport=${PROTO_PGPORT:-55450}
results=${RESULTS:-$here/results}
read -r -a variants <<<"${VARIANTS:-base floor ideal extension plpgsql}"
hz=$(getconf CLK_TCK)
ncpu=$(nproc)

step() { printf '\n== %s\n' "$*"; }

rm -rf "$results"
mkdir -p "$results/logs"

cleanup() { "$root/scripts/pgcluster.sh" stop "$pgdir" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
start_time=$(date +%s)

step "machine"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "cores: $(nproc); cpu: $cpu; $(pgbench --version)" | tee "$results/machine.txt"

# What is measured: the installed library. If it is reinstalled during the
# run (each pgbench run opens new backends, which load the file then), the
# results mix two builds: checked again at the end.
solib="$(pg_config --pkglibdir)/idempotency.so"
so_sum() { sha256sum "$solib" | cut -c1-16; }
so_start=$(so_sum)
{
  echo "installed library: $solib sha256 $so_start ($(date -u -r "$solib" '+%F %T UTC'))"
  echo "source: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$root" diff --quiet HEAD -- src extension 2>/dev/null || echo ' + uncommitted changes in src/ or extension/')"
} | tee "$results/build.txt"

step "cluster"
PGCLUSTER_CONF="fsync = on" "$root/scripts/pgcluster.sh" start "$pgdir" "$pgport"
# shellcheck disable=SC1091
source "$pgdir/env"
export PGDATABASE=protobench
psql_() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }
psql_ -d postgres -c "CREATE DATABASE protobench"
psql_ <<SQL
CREATE EXTENSION idempotency;
\i $here/setup.sql
\i $here/plpgsql_peer.sql
\i $here/diagnostics.sql
ALTER TABLE bench.effects SET (autovacuum_enabled = off);
ALTER TABLE bench.ideal_keys SET (autovacuum_enabled = off);
ALTER TABLE idempotency.keys SET (autovacuum_enabled = off);
ALTER TABLE peer.keys SET (autovacuum_enabled = off);
SQL
psql_ -At -c "SELECT name || ' = ' || setting FROM pg_settings WHERE name IN
  ('fsync','full_page_writes','synchronous_commit','wal_level','shared_buffers','max_wal_size','checkpoint_timeout','server_version')
  ORDER BY name" | tee "$results/settings.txt"

step "same answers from the extension and the peer"
psql_ -At -F ' | ' -f "$here/check.sql" | tee "$results/check.txt"
ext=$(grep '^ext' "$results/check.txt" | sed 's/^ext  //')
peer=$(grep '^peer' "$results/check.txt" | sed 's/^peer //')
expected=$'started  | started\ncomplete | t\nreplay   | replay | 201 | t\nmismatch | mismatch | ord_1'
if [[ $ext != "$expected" || $peer != "$expected" ]]; then
  echo "check failed: the extension and the peer do not both give:" >&2
  echo "$expected" >&2
  exit 1
fi
echo "ok: both give started, true, replay (201, same body), mismatch (ord_1)"

reset_tables() {
  psql_ -c "TRUNCATE bench.effects, bench.ideal_keys, idempotency.keys, peer.keys RESTART IDENTITY" -c "CHECKPOINT"
}

# CPU ticks (user + nice + system) of the whole machine, and of this cluster
# (postmaster and its children, with the children it has reaped).
cpu_busy() { awk '/^cpu /{print $2 + $3 + $4}' /proc/stat; }
pg_ticks() {
  local pm
  pm=$(head -1 "$pgdir/data/postmaster.pid")
  { echo "$pm"; ps -o pid= --ppid "$pm"; } | while read -r p; do
    sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null || true
  done | awk '{s += $12 + $13 + $14 + $15} END {print s + 0}'
}
# Kernel threads (I/O completion, journal, ...): work this benchmark causes, not "other".
kthread_ticks() {
  ps -o pid= --ppid 2 | while read -r p; do
    sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null || true
  done | awk '{s += $12 + $13} END {print s + 0}'
}
# Reaped-children ticks of shell process $1: pgbench's CPU.
child_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $14 + $15}'; }

# The settings a variant's sessions get besides synchronous_commit: the
# contents of VARIANT.options, if there is one (extension_distributed: the
# extension's script in the distributed mode).
variant_options() { if [[ -f $here/$1.options ]]; then cat "$here/$1.options"; fi; }

# run SETTING VARIANT LABEL pgbench-args... : one pgbench run from empty tables,
# log kept; prints "TPS OTHER_CPU_PERCENT".
run() {
  local sc=$1 v=$2 label=$3
  shift 3
  local log="$results/logs/$label.log" rc=0
  reset_tables
  local b0 p0 s0 k0 t0 b1 p1 s1 k1 t1 me=$BASHPID
  b0=$(cpu_busy); p0=$(pg_ticks); s0=$(child_ticks "$me"); k0=$(kthread_ticks); t0=$(date +%s.%N)
  PGOPTIONS="-c synchronous_commit=$sc $(variant_options "$v")" pgbench -n -M prepared -c "$clients" -j "$jobs" "$@" \
    -f "$here/$v.sql" >"$log" 2>&1 || rc=$?
  t1=$(date +%s.%N); b1=$(cpu_busy); p1=$(pg_ticks); s1=$(child_ticks "$me"); k1=$(kthread_ticks)
  local other
  other=$(awk -v b="$((b1 - b0))" -v p="$((p1 - p0 + k1 - k0))" -v s="$((s1 - s0))" -v t0="$t0" -v t1="$t1" \
    -v hz="$hz" -v n="$ncpu" 'BEGIN {x = 100 * (b - p - s) / ((t1 - t0) * hz * n); printf "%.1f", (x < 0 ? 0 : x)}')
  local tps failed aborted txs cpu_us
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log")
  txs=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log")
  # Server CPU (backends and auxiliary processes, not kernel threads) per transaction, in µs.
  cpu_us=$(awk -v p="$((p1 - p0))" -v n="${txs:-0}" -v hz="$hz" 'BEGIN {printf "%.1f", (n > 0 ? p * 1e6 / hz / n : 0)}')
  failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$log")
  aborted=$(grep -c -i -E 'aborted|error' "$log" || true)
  if [[ $rc -ne 0 || -z $tps || ${failed:-0} -ne 0 || $aborted -ne 0 ]]; then
    echo "!! $label: pgbench exit $rc, failed=${failed:-?}, error lines=$aborted (see $log)" >&2
    grep -i -E 'aborted|error' "$log" | head -5 >&2 || true
    echo "$label	rc=$rc failed=${failed:-?} errors=$aborted" >>"$results/problems.txt"
  fi
  echo "${tps:-0} $other $cpu_us"
}

printf 'sync_commit\tround\tposition\tvariant\ttps\tother_cpu_pct\tserver_cpu_us_per_tx\n' >"$results/raw.tsv"
printf 'sync_commit\tround\tvariant\tattempt\ttps\tother_cpu_pct\tserver_cpu_us_per_tx\n' >"$results/attempts.tsv"
for sc in $settings; do
  step "synchronous_commit = $sc: warm-up (${warmup} s each)"
  for v in "${variants[@]}"; do
    read -r tps other cpu <<<"$(run "$sc" "$v" "warmup-$sc-$v" -T "$warmup")"
    printf '  %-16s %10.1f tps   server CPU %6.1f µs/tx   other CPU %5.1f%%\n' "$v" "$tps" "$cpu" "$other"
  done
  for ((r = 1; r <= rounds; r++)); do
    step "synchronous_commit = $sc: round $r of $rounds (${duration} s each)"
    for ((i = 0; i < ${#variants[@]}; i++)); do
      v=${variants[$(((i + r - 1) % ${#variants[@]}))]}
      for ((attempt = 0; ; attempt++)); do
        read -r tps other cpu <<<"$(run "$sc" "$v" "sc-$sc-r$r-$v-a$attempt" -T "$duration")"
        printf '  %-16s %10.1f tps   server CPU %6.1f µs/tx   other CPU %5.1f%%\n' "$v" "$tps" "$cpu" "$other"
        printf '%s\t%d\t%s\t%s\t%s\t%s\t%s\n' "$sc" "$r" "$v" "$attempt" "$tps" "$other" "$cpu" >>"$results/attempts.tsv"
        if ((attempt >= retries)) || awk -v o="$other" -v m="$other_max" 'BEGIN {exit !(o <= m)}'; then break; fi
        echo "     (others used more than $other_max% of the machine: run again)"
      done
      printf '%s\t%d\t%d\t%s\t%s\t%s\t%s\n' "$sc" "$r" "$((i + 1))" "$v" "$tps" "$other" "$cpu" >>"$results/raw.tsv"
    done
  done
done

step "per-request WAL and key-table statistics (-t $stat_tx per client, synchronous_commit = off)"
printf 'variant\ttx\twal_bytes\twal_records\tn_tup_ins\tn_tup_upd\tn_tup_hot_upd\tn_tup_del\tn_dead_tup\tn_live_tup\tkey_rows\tkey_heap_bytes\tkey_index_bytes\n' >"$results/stats.tsv"
for v in "${variants[@]}"; do
  case $v in
    ideal | ideal_upsert) table=bench.ideal_keys ;;
    extension | extension_noset) table=idempotency.keys ;;
    plpgsql) table=peer.keys ;;
    *) table= ;;
  esac
  reset_tables
  [[ -n $table ]] && psql_ -c "SELECT pg_stat_reset_single_table_counters('$table'::regclass)" >/dev/null
  psql_ -c "SELECT pg_stat_reset_shared('wal')" >/dev/null
  sleep 1
  lsn0=$(psql_ -At -c "SELECT pg_current_wal_lsn()")
  log="$results/logs/stats-$v.log"
  rc=0
  PGOPTIONS="-c synchronous_commit=off $(variant_options "$v")" pgbench -n -M prepared -c "$clients" -j "$jobs" -t "$stat_tx" \
    -f "$here/$v.sql" >"$log" 2>&1 || rc=$?
  processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log")
  if [[ $rc -ne 0 || ${processed:-0} -ne $((clients * stat_tx)) ]] || grep -q -i -E 'aborted|error' "$log"; then
    echo "!! stats-$v: pgbench exit $rc, processed ${processed:-?} (see $log)" >&2
    echo "stats-$v	rc=$rc processed=${processed:-?}" >>"$results/problems.txt"
  fi
  lsn1=$(psql_ -At -c "SELECT pg_current_wal_lsn()")
  sleep 2  # let the exiting backends' statistics arrive
  if [[ -n $table ]]; then
    tstats=$(psql_ -At -F $'\t' -c "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup, n_live_tup,
        (SELECT count(*) FROM $table), pg_relation_size('$table'::regclass), pg_indexes_size('$table'::regclass)
      FROM pg_stat_user_tables WHERE relid = '$table'::regclass")
  else
    tstats=$'-\t-\t-\t-\t-\t-\t-\t-\t-'
  fi
  walrow=$(psql_ -At -F $'\t' -c "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')::bigint, wal_records FROM pg_stat_wal")
  printf '%s\t%s\t%s\t%s\n' "$v" "${processed:-0}" "$walrow" "$tstats" >>"$results/stats.tsv"
  echo "  $v: $(tail -1 "$results/stats.tsv" | cut -f2-)"
done

# Errors the server logged (there should be none).
# pg_cron starts before scripts/pgcluster.sh creates its database: that FATAL
# at startup is expected and left out.
grep -E 'ERROR|FATAL|PANIC' "$pgdir/server.log" | grep -v 'database "idem_cron" does not exist' \
  >"$results/server-errors.txt" || true

so_end=$(so_sum)
if [[ $so_end != "$so_start" ]]; then
  msg="the installed library changed during the run ($so_start -> $so_end): the results mix two builds"
  echo "!! $msg" >&2
  echo "build	$msg" >>"$results/problems.txt"
fi

step "summary"
elapsed=$(($(date +%s) - start_time))
OTHER_MAX=$other_max VARIANT_LIST="${variants[*]}" python3 - "$results" "$rounds" "$duration" "$clients" "$jobs" "$stat_tx" "$elapsed" <<'PY' | tee "$results/summary.md"
import csv, statistics, sys, os
res, rounds, duration, clients, jobs, stat_tx, elapsed = sys.argv[1:]
rows = list(csv.DictReader(open(os.path.join(res, "raw.tsv")), delimiter="\t"))
variants = os.environ["VARIANT_LIST"].split()
settings = []
for r in rows:
    if r["sync_commit"] not in settings:
        settings.append(r["sync_commit"])
print(open(os.path.join(res, "build.txt")).read())
print(f"{clients} clients, {jobs} pgbench threads, prepared mode, {rounds} rounds x {duration} s per variant, "
      f"fresh random key per transaction; wall time {int(elapsed)//60} min {int(elapsed)%60} s\n")
med = {}
for sc in settings:
    for v in variants:
        xs = [float(r["tps"]) for r in rows if r["sync_commit"] == sc and r["variant"] == v]
        med[sc, v] = (statistics.median(xs), min(xs), max(xs), len(xs))
print("Median TPS (min-max over rounds):\n")
print("| variant | " + " | ".join(f"synchronous_commit = {sc}" for sc in settings) + " |")
print("|---|" + "---:|" * len(settings))
for v in variants:
    print(f"| {v} | " + " | ".join(f"{med[sc, v][0]:.0f} ({med[sc, v][1]:.0f}-{med[sc, v][2]:.0f})" for sc in settings) + " |")

def paired(sc, a, b):
    # per-round ratio a/b (same round), median over rounds
    ra = {r["round"]: float(r["tps"]) for r in rows if r["sync_commit"] == sc and r["variant"] == a}
    rb = {r["round"]: float(r["tps"]) for r in rows if r["sync_commit"] == sc and r["variant"] == b}
    return statistics.median(ra[k] / rb[k] for k in ra if k in rb and rb[k] > 0)

ratios = [("extension", "ideal"), ("extension", "plpgsql"), ("extension", "floor"), ("ideal", "floor"),
          ("plpgsql", "floor"), ("floor", "base"),
          ("extension_noset", "extension"), ("extension_noset", "ideal"), ("ideal_upsert", "ideal")]
ratios = [(a, b) for a, b in ratios if a in variants and b in variants]
print("\nRatios of the medians (in brackets: median of the per-round ratios):\n")
print("| ratio | " + " | ".join(f"synchronous_commit = {sc}" for sc in settings) + " |")
print("|---|" + "---:|" * len(settings))
for a, b in ratios:
    print(f"| {a} / {b} | " + " | ".join(
        f"{med[sc, a][0] / med[sc, b][0]:.3f} ({paired(sc, a, b):.3f})" for sc in settings) + " |")

print("\nServer CPU per transaction, µs (median over rounds; all server processes, pgbench excluded; "
      "difference to ideal in brackets):\n")
print("| variant | " + " | ".join(f"synchronous_commit = {sc}" for sc in settings) + " |")
print("|---|" + "---:|" * len(settings))
cpu = {}
for sc in settings:
    for v in variants:
        cpu[sc, v] = statistics.median(float(r["server_cpu_us_per_tx"]) for r in rows if r["sync_commit"] == sc and r["variant"] == v)
for v in variants:
    print(f"| {v} | " + " | ".join(
        f"{cpu[sc, v]:.1f}" + (f" ({cpu[sc, v] - cpu[sc, 'ideal']:+.1f})" if "ideal" in variants and v != "ideal" else "")
        for sc in settings) + " |")

def verdict(ok): return "met" if ok else "NOT met"
goals = []
if "off" in settings and {"extension", "ideal"} <= set(variants):
    x = med["off", "extension"][0] / med["off", "ideal"][0]
    goals.append(f"* synchronous_commit = off: extension / ideal = {x:.3f} (goal >= 0.95): {verdict(x >= 0.95)}")
if "off" in settings and {"extension", "plpgsql"} <= set(variants):
    y = med["off", "extension"][0] / med["off", "plpgsql"][0]
    goals.append(f"* synchronous_commit = off: extension / plpgsql = {y:.3f} (goal >= 1.3): {verdict(y >= 1.3)}")
if "on" in settings and {"extension", "ideal"} <= set(variants):
    z = med["on", "extension"][0] / med["on", "ideal"][0]
    goals.append(f"* synchronous_commit = on: extension / ideal = {z:.3f} (goal >= 0.95, within 5%): {verdict(z >= 0.95)}")
if goals:
    print("\nGoals (ratios of the medians):\n")
    print("\n".join(goals))

others = [float(r["other_cpu_pct"]) for r in rows]
other_max = float(os.environ.get("OTHER_MAX", "10"))
attempts = list(csv.DictReader(open(os.path.join(res, "attempts.tsv")), delimiter="\t"))
repeated = len(attempts) - len(rows)
busy = [r for r in rows if float(r["other_cpu_pct"]) > other_max]
print(f"\nOther CPU (the machine minus this cluster and pgbench) during the timed runs: median "
      f"{statistics.median(others):.1f}%, max {max(others):.1f}% of {os.cpu_count()} cores; "
      f"{repeated} runs repeated because others used more than {other_max:g}%; "
      f"{len(busy)} of {len(rows)} kept runs still above it" +
      ("" if not busy else ": " + ", ".join(f"{r['sync_commit']}/r{r['round']}/{r['variant']} {float(r['other_cpu_pct']):.0f}%" for r in busy)))

st = list(csv.DictReader(open(os.path.join(res, "stats.tsv")), delimiter="\t"))
print(f"\nPer request, from a fixed-count run ({clients} x {stat_tx} transactions, synchronous_commit = off, "
      "tables empty before; key-table counters reset before, read after):\n")
print("| variant | WAL bytes / request | WAL records / request | key table n_tup_ins | n_tup_upd | n_tup_hot_upd | n_tup_del | n_dead_tup | key rows |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in st:
    n = int(s["tx"]) or 1
    if s["n_tup_ins"] == "-":
        tail = "| - " * 6
    else:
        tail = "".join(f"| {s[c]} " for c in ["n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del", "n_dead_tup", "key_rows"])
    print(f"| {s['variant']} | {int(s['wal_bytes']) / n:.0f} | {int(s['wal_records']) / n:.2f} " + tail + "|")

problems = os.path.join(res, "problems.txt")
errors = os.path.join(res, "server-errors.txt")
print()
if os.path.exists(problems):
    print("PROBLEMS (pgbench errors or failed transactions):")
    print(open(problems).read())
else:
    print("No pgbench run reported an error or a failed transaction.")
if os.path.exists(errors) and os.path.getsize(errors) > 0:
    print(f"Server log errors ({errors}):")
    print("".join(open(errors).readlines()[:10]))
else:
    print("The server logged no ERROR, FATAL or PANIC.")
PY
