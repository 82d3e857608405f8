#!/usr/bin/env bash
# Benchmark, run by hand (prints, never asserts): server CPU per idempotent
# write through a Citus coordinator and two workers against one plain node, in
# one run. Citus is not in Debian, so this needs a PostgreSQL that has Citus
# installed (PGBIN) and exits 77, saying SKIPPED, without it.
#
# Starts tests/scale-out/citus_cluster.sh (coordinator, two workers,
# idempotency.distribute()) and a plain single node with the same tables.
# pgbench runs the transactional protocol as the clients send it:
#   BEGIN; SELECT ... FROM idempotency.begin(principal, key, ...);
#   INSERT INTO orders ...; SELECT idempotency.complete(...); COMMIT;
# with a fresh key per transaction and one of 997 principals, for
#   single               the plain node (the fast path)
#   single+distributed   the plain node, sessions with idempotency.distributed = on
#   citus                the coordinator (begin and complete delegated to the workers)
#   routed               the worker that holds the principal's shard, server defaults,
#                        sessions without idempotency.routed (Citus plans the
#                        parameterized call of a distributed function again at
#                        every execution: docs/scale-out.md)
#   routed-marked        the same, sessions with idempotency.routed = on (what the
#                        routers set on their connections to the workers: the call
#                        keeps its generic plan; the application's statements are
#                        planned as before)
#   routed-generic       the same, sessions with plan_cache_mode = force_generic_plan
#                        (every statement's plan changes: for comparison only)
# and, for what Citus itself costs, the same order written without a key
# (BEGIN; INSERT; COMMIT) on each: plain-single, plain-citus, plain-routed,
# plain-routed-generic (routed-marked's key is measured against plain-routed:
# the setting changes no plan of the plain transaction). Each round runs every
# variant twice, half the seconds each, in mirrored order (forward, then back),
# so that a load rising or falling through the round weighs on all alike.
# Server CPU: bench/lib.sh cpu_ticks over every cluster
# of the setup (for citus all three), per request; medians and ratios, and the
# routed key's cost over the single node's key cost round by round.
#
#   PGBIN=/path/to/bin bench/scale-out/citus.sh    BENCH_ROUNDS=3 BENCH_SECONDS=10 BENCH_CLIENTS=4 BENCH_PORT=27300
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../lib.sh
source bench/lib.sh
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
if [[ ! -e $("$PGBIN/pg_config" --pkglibdir)/citus.so ]]; then
  echo "SKIPPED: citus is not installed for $PGBIN"
  exit 77
fi
rounds=${BENCH_ROUNDS:-3}
seconds=${BENCH_SECONDS:-10}
clients=${BENCH_CLIENTS:-4}
port=${BENCH_PORT:-27300}
work=$(mktemp -d /tmp/idem-bench-citus.XXXXXX)
chmod 755 "$work"
cleanup() {
  tests/scale-out/citus_cluster.sh stop "$work/citus"
  scripts/pgcluster.sh stop "$work/single" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

tests/scale-out/citus_cluster.sh start "$work/citus" "$port"
PGCLUSTER_PRELOAD=idempotency scripts/pgcluster.sh start "$work/single" $((port + 5)) >/dev/null
"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $((port + 5)) -U postgres -d postgres \
  -f bench/scale-out/single_node.sql
single_dsn="postgresql://postgres@127.0.0.1:$((port + 5))/shop"
citus_dsn="postgresql://postgres@127.0.0.1:$port/shop"
citus_clusters=("$work/citus/coordinator" "$work/citus/worker1" "$work/citus/worker2")

cat >"$work/write.sql" <<'SQL'
\set k random(1, 1000000000000000000)
\set u :k % 997
BEGIN;
SELECT outcome FROM idempotency.begin('user-' || :u, 'c' || :client_id || '-' || :k, 'create_order', '\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea);
INSERT INTO orders (principal, item, quantity) VALUES ('user-' || :u, 'book', 2);
SELECT idempotency.complete('user-' || :u, 'c' || :client_id || '-' || :k, 201, '\x7b226964223a317d'::bytea, '{"Content-Type": "application/json"}'::jsonb, 'ord_1');
COMMIT;
SQL
cat >"$work/plain.sql" <<'SQL'
\set k random(1, 1000000000000000000)
\set u :k % 997
BEGIN;
INSERT INTO orders (principal, item, quantity) VALUES ('user-' || :u, 'book', 2);
COMMIT;
SQL
# Routed (issue 24): the same two transactions sent straight to the worker
# that holds the principal's shard, as a client's router does; one principal
# whose shard is on worker 1 (a pgbench variable cannot pick from a list).
sed "s/'user-' || :u/:p/g" "$work/write.sql" >"$work/write_routed.sql"
sed "s/'user-' || :u/:p/g" "$work/plain.sql" >"$work/plain_routed.sql"
routed_port=$((port + 1))
routed_principal=$("$PGBIN/psql" -X -qAt "$citus_dsn" -c "
  SELECT 'user-' || i FROM generate_series(0, 996) AS i
   WHERE (SELECT n.nodeport FROM pg_dist_placement pl JOIN pg_dist_node n ON n.groupid = pl.groupid
           WHERE pl.shardid = get_shard_id_for_distribution_column('idempotency.keys', 'user-' || i))
         = $routed_port
   ORDER BY i LIMIT 1")
routed_dsn="postgresql://postgres@127.0.0.1:$routed_port/shop"
chmod 644 "$work/write.sql" "$work/plain.sql" "$work/write_routed.sql" "$work/plain_routed.sql"
ticks_per_second=$(getconf CLK_TCK)
variants=(single single+distributed citus routed routed-marked routed-generic plain-single plain-citus
  plain-routed plain-routed-generic)

echo "cores: $(nproc); $clients clients, $seconds s per round, $rounds rounds; pgbench -M prepared"
printf '%-20s %6s %8s %10s %12s\n' variant round tps requests "cpu us/req"
declare -A per_request round_us
round_ratios=""
round_ratios_generic=""
round_ratios_marked=""
# Mirrored rounds (see the top): a variant's figure is the sum of its two halves.
half=$(((seconds + 1) / 2))
mirrored=("${variants[@]}")
for ((i = ${#variants[@]} - 1; i >= 0; i--)); do mirrored+=("${variants[i]}"); done
for ((r = 1; r <= rounds; r++)); do
  declare -A round_ticks=() round_n=() round_seconds=()
  for v in "${mirrored[@]}"; do
    options=""
    script=$work/write.sql
    [[ $v == plain-* ]] && script=$work/plain.sql
    [[ $v == routed* ]] && script=$work/write_routed.sql
    [[ $v == plain-routed* ]] && script=$work/plain_routed.sql
    session=""  # the routed sessions' startup options
    [[ $v == *-generic ]] && session="-c plan_cache_mode=force_generic_plan"
    [[ $v == *-marked ]] && session="-c idempotency.routed=on"
    case $v in
    single) dsn=$single_dsn; clusters=("$work/single") ;;
    single+distributed) dsn=$single_dsn; clusters=("$work/single"); options="-c idempotency.distributed=on" ;;
    citus | plain-citus) dsn=$citus_dsn; clusters=("${citus_clusters[@]}") ;;
    routed* | plain-routed*) dsn=$routed_dsn; clusters=("${citus_clusters[@]}"); options="-D p=$routed_principal" ;;
    plain-single) dsn=$single_dsn; clusters=("$work/single") ;;
    esac
    before=$(cpu_ticks "${clusters[@]}")
    if [[ $v == *routed* ]]; then
      out=$(PGOPTIONS="$session" "$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$clients" -T "$half" $options \
        -f "$script" "$dsn" 2>&1) || { echo "$out"; exit 1; }
    else
      out=$(PGOPTIONS="$options" "$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$clients" -T "$half" \
        -f "$script" "$dsn" 2>&1) || { echo "$out"; exit 1; }
    fi
    sleep 1  # the backends exit and are reaped: their CPU moves into the postmaster's cutime
    after=$(cpu_ticks "${clusters[@]}")
    round_ticks[$v]=$((${round_ticks[$v]:-0} + after - before))
    round_n[$v]=$((${round_n[$v]:-0} + $(pgbench_value "$out" transactions)))
    round_seconds[$v]=$((${round_seconds[$v]:-0} + half))
  done
  for v in "${variants[@]}"; do
    n=${round_n[$v]}
    tps=$(echo "scale=1; $n / ${round_seconds[$v]}" | bc)
    us=$(echo "scale=1; ${round_ticks[$v]} * 1000000 / $ticks_per_second / $n" | bc)
    per_request[$v]+="$us"$'\n'
    round_us[$v]=$us
    printf '%-20s %6s %8.0f %10s %12s\n' "$v" "$r" "$tps" "$n" "$us"
  done
  # This round's routed key cost over its single-node key cost (each a keyed
  # minus a plain figure of the same round).
  single_key=$(echo "${round_us[single]} - ${round_us[plain-single]}" | bc)
  round_ratios+="$(ratio "$(echo "${round_us[routed]} - ${round_us[plain-routed]}" | bc)" "$single_key")"$'\n'
  round_ratios_generic+="$(ratio "$(echo "${round_us[routed-generic]} - ${round_us[plain-routed-generic]}" | bc)" "$single_key")"$'\n'
  round_ratios_marked+="$(ratio "$(echo "${round_us[routed-marked]} - ${round_us[plain-routed]}" | bc)" "$single_key")"$'\n'
done

echo
echo "median server CPU per request (all postgres processes of the setup):"
declare -A med
for v in "${variants[@]}"; do
  med[$v]=$(printf '%s' "${per_request[$v]}" | median)
  printf '  %-20s %8s us\n' "$v" "${med[$v]}"
done
echo "ratio citus/single: $(ratio "${med[citus]}" "${med[single]}")"
echo "ratio plain-citus/plain-single: $(ratio "${med[plain-citus]}" "${med[plain-single]}") (Citus alone, no key)"
echo "the key's cost: single $(echo "scale=1; ${med[single]} - ${med[plain-single]}" | bc) us, citus $(echo "scale=1; ${med[citus]} - ${med[plain-citus]}" | bc) us per request"
echo "routed to the shard's worker ($routed_principal on $routed_port), idempotency.routed off: the key's cost $(echo "scale=1; ${med[routed]} - ${med[plain-routed]}" | bc) us per request, $(ratio "$(echo "${med[routed]} - ${med[plain-routed]}" | bc)" "$(echo "${med[single]} - ${med[plain-single]}" | bc)") x the single node's"
echo "routed with idempotency.routed = on (as the routers connect): the key's cost $(echo "scale=1; ${med[routed-marked]} - ${med[plain-routed]}" | bc) us per request, $(ratio "$(echo "${med[routed-marked]} - ${med[plain-routed]}" | bc)" "$(echo "${med[single]} - ${med[plain-single]}" | bc)") x the single node's (goal: at most 2 in every round)"
echo "routed with plan_cache_mode = force_generic_plan: the key's cost $(echo "scale=1; ${med[routed-generic]} - ${med[plain-routed-generic]}" | bc) us per request, $(ratio "$(echo "${med[routed-generic]} - ${med[plain-routed-generic]}" | bc)" "$(echo "${med[single]} - ${med[plain-single]}" | bc)") x the single node's"
echo "round by round, routed key / single key: idempotency.routed on: $(printf '%s' "$round_ratios_marked" | tr '\n' ' ')(median $(printf '%s' "$round_ratios_marked" | median)); off: $(printf '%s' "$round_ratios" | tr '\n' ' ')(median $(printf '%s' "$round_ratios" | median)); with force_generic_plan: $(printf '%s' "$round_ratios_generic" | tr '\n' ' ')(median $(printf '%s' "$round_ratios_generic" | median))"
echo "ratio single+distributed/single: $(ratio "${med[single+distributed]}" "${med[single]}")"
echo "orders: single $("$PGBIN/psql" -X -qAt "$single_dsn" -c "SELECT count(*) FROM orders"), citus $("$PGBIN/psql" -X -qAt "$citus_dsn" -c "SELECT count(*) FROM orders")"
echo "key rows on the citus shards: $("$PGBIN/psql" -X -qAt "$citus_dsn" -c "SELECT count(*) FROM idempotency.keys")"
