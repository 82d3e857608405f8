#!/usr/bin/env bash
# Benchmark (prints, never asserts): server CPU per idempotent write, on one
# node and through PL/Proxy over 4 shards. Starts two throwaway setups with
# tests/scale-out/plproxy_cluster.sh: one shard (called directly, its proxy
# idle and not counted) and a proxy with 4 shards. pgbench runs the orders
# write shop.create_order (idempotency.begin, INSERT, idempotency.complete in
# one shard function) with a fresh key per transaction, for
#   single        pgbench -> the one shard's shop.create_order
#   proxy1        pgbench -> a proxy with that one shard (the hop alone)
#   proxy         pgbench -> the proxy's shop.create_order -> the owning one of 4 shards
# and, when the installed extension has the setting idempotency.distributed,
# the same two with it on in the shards' database (ALTER DATABASE ... SET).
# Rounds are interleaved (single, proxy1, proxy, single+distributed,
# proxy+distributed, then again). Server CPU is read from /proc: utime + stime of each cluster's
# postmaster and its live children, plus the postmaster's cutime + cstime (the
# backends that exited, reaped by it), summed over every cluster of the setup
# (proxy and shards), before and after the round; per request = delta /
# transactions (pgbench's own CPU is not counted). Prints each round, with the
# proxy cluster's share, the medians, and the ratios proxy/single.
#
#   bench/scale-out/plproxy.sh             # BENCH_ROUNDS=3, BENCH_SECONDS=10, BENCH_CLIENTS=4
#   BENCH_PORT=29700                       # first port (uses BENCH_PORT..+9)
#
# Needs root or the postgres user, postgresql-15-plproxy, pgbench, the
# extension installed. The numbers are CPU time, so a busy machine changes
# them less than it changes throughput; still, run it on a quiet one.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../lib.sh
source bench/lib.sh
rounds=${BENCH_ROUNDS:-3}
seconds=${BENCH_SECONDS:-10}
clients=${BENCH_CLIENTS:-4}
port=${BENCH_PORT:-29700}
pgbin=${PGBIN:-/usr/lib/postgresql/${IDEM_PG_VERSION:-15}/bin}
work=$(mktemp -d /tmp/idem-bench-scale-out.XXXXXX)
chmod 755 "$work"
cleanup() {
  bash tests/scale-out/plproxy_cluster.sh stop "$work/one" >/dev/null 2>&1 || true
  bash tests/scale-out/plproxy_cluster.sh stop "$work/four" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

bash tests/scale-out/plproxy_cluster.sh start "$work/one" "$port" 1 | tail -1
bash tests/scale-out/plproxy_cluster.sh start "$work/four" $((port + 5)) 4 | tail -1
single_dsn="postgresql://postgres@127.0.0.1:$((port + 1))/shop"
proxy_dsn="postgresql://postgres@127.0.0.1:$((port + 5))/shop"
one_clusters=("$work/one/shard0")
one_proxied=("$work/one/proxy" "$work/one/shard0")
one_proxy_dsn="postgresql://postgres@127.0.0.1:$port/shop"
four_clusters=("$work/four/proxy" "$work/four/shard0" "$work/four/shard1" "$work/four/shard2" "$work/four/shard3")
shard_dsns=("$single_dsn")
for i in 0 1 2 3; do shard_dsns+=("postgresql://postgres@127.0.0.1:$((port + 6 + i))/shop"); done

ticks_per_second=$(getconf CLK_TCK)

variants=(single proxy1 proxy)
if psql -X -qAt "$single_dsn" -c "SHOW idempotency.distributed" >/dev/null 2>&1; then
  variants+=(single+distributed proxy+distributed)
else
  echo "idempotency.distributed: not in the installed extension (SHOW failed): the distributed variants are skipped"
fi

distributed() {  # distributed on|off: the setting in every shard's database shop (new sessions)
  local dsn
  for dsn in "${shard_dsns[@]}"; do
    if [[ $1 == on ]]; then
      psql -X -q "$dsn" -c "ALTER DATABASE shop SET idempotency.distributed = on"
    else
      psql -X -q "$dsn" -c "ALTER DATABASE shop RESET idempotency.distributed"
    fi
  done
}

cat >"$work/write.sql" <<'SQL'
\set k random(1, 1000000000000000000)
\set u :k % 997
SELECT status FROM shop.create_order('user-' || :u, 'r' || :round || '-c' || :client_id || '-' || :k, '/orders', convert_to('{"item":"book","quantity":2}', 'UTF8'));
SQL
chmod 644 "$work/write.sql"

echo "cores: $(nproc); $clients clients, $seconds s per round, $rounds rounds; pgbench -M prepared"
printf '%-20s %6s %8s %10s %12s %14s\n' variant round tps requests "cpu us/req" "of which proxy"
round_id=0
declare -A per_request
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    round_id=$((round_id + 1))
    if [[ $v == *distributed ]]; then distributed on; else distributed off; fi
    case $v in
    single*) dsn=$single_dsn; clusters=("${one_clusters[@]}") ;;
    proxy1) dsn=$one_proxy_dsn; clusters=("${one_proxied[@]}") ;;
    *) dsn=$proxy_dsn; clusters=("${four_clusters[@]}") ;;
    esac
    before=$(cpu_ticks "${clusters[@]}")
    proxy_before=$(cpu_ticks "${clusters[0]}")
    out=$("$pgbin/pgbench" -n -M prepared -c "$clients" -j "$clients" -T "$seconds" -D round="$round_id" \
      -f "$work/write.sql" "$dsn" 2>&1) || { echo "$out"; exit 1; }
    sleep 1  # the backends exit and are reaped: their CPU moves into the postmaster's cutime
    after=$(cpu_ticks "${clusters[@]}")
    proxy_after=$(cpu_ticks "${clusters[0]}")
    n=$(pgbench_value "$out" transactions)
    tps=$(pgbench_value "$out" tps)
    failed=$(pgbench_value "$out" failed)
    us=$(echo "scale=1; ($after - $before) * 1000000 / $ticks_per_second / $n" | bc)
    per_request[$v]+="$us"$'\n'
    share=-
    [[ $v == proxy* ]] && share=$(echo "scale=1; ($proxy_after - $proxy_before) * 1000000 / $ticks_per_second / $n" | bc)
    printf '%-20s %6s %8.0f %10s %12s %14s%s\n' "$v" "$r" "$tps" "$n" "$us" "$share" "${failed:+ ($failed failed)}"
  done
done
distributed off

echo
echo "median server CPU per request (all postgres processes of the setup):"
declare -A med
for v in "${variants[@]}"; do
  med[$v]=$(printf '%s' "${per_request[$v]}" | median)
  printf '  %-20s %8s us\n' "$v" "${med[$v]}"
done
echo "ratio proxy/single: $(ratio "${med[proxy]}" "${med[single]}") (proxy with 4 shards)"
echo "ratio proxy1/single: $(ratio "${med[proxy1]}" "${med[single]}") (proxy with the single node as its one shard)"
if [[ -n ${med[proxy+distributed]:-} ]]; then
  echo "ratio proxy+distributed/single+distributed: $(ratio "${med[proxy+distributed]}" "${med[single+distributed]}")"
  echo "ratio single+distributed/single: $(ratio "${med[single+distributed]}" "${med[single]}")"
fi
# Written rows, for the record: every request a fresh key (one order each).
total=0
for dsn in "${shard_dsns[@]}"; do total=$((total + $(psql -X -qAt "$dsn" -c "SELECT count(*) FROM orders"))); done
echo "orders written: $total"
