#!/usr/bin/env bash
# Benchmark, run by hand (prints, never asserts): server instructions per
# transaction of the keyed write and of the same write without a key, on one
# plain node and on the Citus worker that holds the principal's shard (issue
# 40: the routed key at most 2x one node's key). Counted with callgrind in a
# single-user backend, like bench/protocol/instructions.sh: exact and
# independent of other load on the machine, which bench/scale-out/citus.sh's
# CPU time per request is not. What it leaves out is the same on both sides:
# the kernel (each statement's round trip) and the processes beside the
# backend (WAL writer, Citus's maintenance daemon).
#
# Sets up tests/scale-out/citus_cluster.sh (coordinator, two workers,
# idempotency.distribute()) and a plain node with the same tables, stops them,
# then feeds each data directory N and 2N transactions as pgbench -M prepared
# sends them in bench/scale-out/citus.sh (BEGIN; EXECUTE begin; EXECUTE
# insert; EXECUTE complete; COMMIT, a fresh key each; without a key: BEGIN;
# EXECUTE insert; COMMIT); (2N - N) / N is one transaction's cost, startup
# cancelled out. Setups:
#   single          the plain node
#   routed-marked   the shard's worker, idempotency.routed = on (what the
#                   routers set on their connections to the workers)
#   routed          the shard's worker, server defaults (Citus plans each
#                   prepared call of a distributed function again)
# Needs Citus installed for PGBIN's PostgreSQL and valgrind; exits 77, saying
# SKIPPED, without either.
#
#   PGBIN=/path/to/bin bench/scale-out/citus_instructions.sh   INSTR_N=200 BENCH_PORT=27400
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
if [[ ! -e $("$PGBIN/pg_config" --pkglibdir)/citus.so ]]; then
  echo "SKIPPED: citus is not installed for $PGBIN"
  exit 77
fi
command -v valgrind >/dev/null || { echo "SKIPPED: needs valgrind"; exit 77; }
n=${INSTR_N:-200}
port=${BENCH_PORT:-27400}
work=$(mktemp -d /tmp/idem-bench-citus-instr.XXXXXX)
chmod 755 "$work"
as_postgres() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
data_dirs=("$work/citus/coordinator" "$work/citus/worker1" "$work/citus/worker2" "$work/single")
stop_all() {
  for dir in "${data_dirs[@]}"; do
    [[ -f $dir/data/postmaster.pid ]] && as_postgres "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
  done
  return 0
}
trap 'stop_all; rm -rf "$work"' EXIT

tests/scale-out/citus_cluster.sh start "$work/citus" "$port"
PGCLUSTER_PRELOAD=idempotency scripts/pgcluster.sh start "$work/single" $((port + 5)) >/dev/null
"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $((port + 5)) -U postgres -d postgres \
  -f bench/scale-out/single_node.sql
# The first principal whose shard is on worker 1.
principal=$("$PGBIN/psql" -X -qAt -h 127.0.0.1 -p "$port" -U postgres -d shop -c "
  SELECT 'user-' || i FROM generate_series(0, 996) AS i
   WHERE (SELECT n.nodeport FROM pg_dist_placement pl JOIN pg_dist_node n ON n.groupid = pl.groupid
           WHERE pl.shardid = get_shard_id_for_distribution_column('idempotency.keys', 'user-' || i))
         = $((port + 1))
   ORDER BY i LIMIT 1")
citus_version=$("$PGBIN/psql" -X -qAt -h 127.0.0.1 -p "$port" -U postgres -d shop \
  -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'")
stop_all  # a single-user backend needs its data directory to itself

# transactions KIND COUNT TAG: COUNT transactions of KIND (keyed or plain), one
# input line a statement, keys TAG-1 .. TAG-COUNT.
transactions() {
  echo "PREPARE b(text, text) AS SELECT outcome FROM idempotency.begin(\$1, \$2, 'create_order', '\\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea)"
  echo "PREPARE i(text) AS INSERT INTO orders (principal, item, quantity) VALUES (\$1, 'book', 2)"
  echo "PREPARE c(text, text) AS SELECT idempotency.complete(\$1, \$2, 201, '\\x7b226964223a317d'::bytea, '{\"Content-Type\": \"application/json\"}'::jsonb, 'ord_1')"
  local t
  for ((t = 1; t <= $2; t++)); do
    echo "BEGIN"
    [[ $1 == keyed ]] && echo "EXECUTE b('$principal', '$3-$t')"
    echo "EXECUTE i('$principal')"
    [[ $1 == keyed ]] && echo "EXECUTE c('$principal', '$3-$t')"
    echo "COMMIT"
  done
}
# instructions DATA KIND COUNT TAG OPTION...: what the backend executed.
instructions() {
  local data=$1 kind=$2 count=$3 tag=$4 out
  shift 4
  out=$(transactions "$kind" "$count" "$tag" |
    as_postgres valgrind --tool=callgrind --callgrind-out-file=/dev/null "$PGBIN/postgres" --single \
      -D "$data" "$@" shop 2>&1)
  if grep -q "ERROR:" <<<"$out"; then
    grep -m3 "ERROR:" <<<"$out" >&2
    exit 1
  fi
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' <<<"$out"
}

echo "Citus $citus_version, PostgreSQL $("$PGBIN/postgres" --version | awk '{ print $3 }'); principal $principal on worker 1; N=$n"
printf '%-15s %18s %18s %14s\n' setup "keyed instr/tx" "plain instr/tx" "the key's"
declare -A key_cost
for setup in single routed-marked routed; do
  options=()
  data=$work/citus/worker1/data
  case $setup in
  single) data=$work/single/data ;;
  routed-marked) options=(-c idempotency.routed=on) ;;
  esac
  declare -A per=()
  for kind in keyed plain; do
    once=$(instructions "$data" "$kind" "$n" "$setup-$kind-1" "${options[@]}")
    twice=$(instructions "$data" "$kind" $((2 * n)) "$setup-$kind-2" "${options[@]}")
    per[$kind]=$(((twice - once) / n))
  done
  key_cost[$setup]=$((per[keyed] - per[plain]))
  printf '%-15s %18s %18s %14s\n' "$setup" "${per[keyed]}" "${per[plain]}" "${key_cost[$setup]}"
done
ratio() { echo "scale=2; $1 / $2" | bc; }
echo "the routed key over one node's key: idempotency.routed = on (the routers) $(ratio "${key_cost[routed-marked]}" "${key_cost[single]}")x; server defaults without it $(ratio "${key_cost[routed]}" "${key_cost[single]}")x (goal: at most 2)"
