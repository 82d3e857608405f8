#!/usr/bin/env bash
# A throwaway PL/Proxy cluster for the scale-out test and benchmark: NSHARDS
# PostgreSQL clusters (scripts/pgcluster.sh, idempotency preloaded), each with
# database shop loaded from tests/scale-out/shard.sql, and one proxy cluster
# (plproxy, nothing preloaded) whose database shop holds a SQL/MED cluster
# 'orders' (CREATE SERVER orders FOREIGN DATA WRAPPER plproxy, options p0..pN-1)
# and proxy functions with the shards' signatures that run on
# hashtext(principal) & (NPARTS - 1), PL/Proxy's rule.
#
#   plproxy_cluster.sh start DIR BASEPORT NSHARDS [NPARTS]
#       proxy on BASEPORT, shard i on BASEPORT + 1 + i. The proxy uses the first
#       NPARTS shards (default NSHARDS, a power of 2); shards past NPARTS are the
#       empty targets of a resharding (they own their principals under NSHARDS).
#       Writes DIR/cluster.env: PROXY_DSN, SHARD_DSN_<i>, NSHARDS.
#   plproxy_cluster.sh reset DIR NPARTS
#       the databases shop of every cluster dropped and made afresh as start
#       makes them, the proxy on the first NPARTS shards: a fresh setup without
#       starting the clusters again.
#   plproxy_cluster.sh partitions DIR NPARTS
#       points the proxy's cluster at the first NPARTS shards (ALTER SERVER);
#       PL/Proxy reloads it on the next call of every session.
#   plproxy_cluster.sh stop DIR
#       stops every cluster (immediate) and removes DIR.
#
# Needs root or the postgres user (pgcluster.sh), postgresql-15-plproxy and the
# extension installed. IDEM_PG_VERSION / PGBIN as for pgcluster.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
usage="usage: plproxy_cluster.sh start DIR BASEPORT NSHARDS [NPARTS] | reset DIR NPARTS | partitions DIR NPARTS | stop DIR"
cmd=${1:?$usage}
dir=${2:?$usage}

dsn_of() { echo "postgresql://postgres@127.0.0.1:$1/shop"; }
psql_at() {  # psql_at PORT ARGS...: psql on database shop of that cluster, stop on the first error
  local port=$1
  shift
  psql -X -q -v ON_ERROR_STOP=1 "$(dsn_of "$port")" "$@"
}
power_of_two() { (($1 > 0 && ($1 & ($1 - 1)) == 0)); }

# server_options NPARTS [alter]: the options p0..pN-1 of the SQL/MED cluster,
# for CREATE SERVER, or for ALTER SERVER (SET, ADD, DROP) with alter.
server_options() {
  local nparts=$1 mode=${2:-create} i opts=() verb
  # shellcheck disable=SC1091
  source "$dir/cluster.env"  # NSHARDS
  for ((i = 0; i < NSHARDS; i++)); do
    local conn
    conn="host=127.0.0.1 port=$(($(<"$dir/baseport") + 1 + i)) dbname=shop"
    if [[ $mode == create ]]; then
      ((i < nparts)) && opts+=("p$i '$conn'")
    else
      # ALTER SERVER: SET what exists, ADD what is new, DROP what goes.
      local had
      had=$(psql_at "$(<"$dir/baseport")" -Atc "SELECT count(*) FROM pg_foreign_server s, unnest(s.srvoptions) o
                                                 WHERE s.srvname = 'orders' AND o LIKE 'p$i=%'")
      if ((i < nparts)); then
        verb=ADD
        ((had)) && verb=SET
        opts+=("$verb p$i '$conn'")
      elif ((had)); then
        opts+=("DROP p$i")
      fi
    fi
  done
  local IFS=,
  echo "${opts[*]}"
}

# make_databases NPARTS: database shop on every shard (shard.sql; a shard past
# NPARTS owns its principals under NSHARDS) and on the proxy (proxy.sql and the
# SQL/MED cluster on the first NPARTS shards), each dropped first if it is there.
make_databases() {
  local nparts=$1 baseport i port owner_parts
  baseport=$(<"$dir/baseport")
  # shellcheck disable=SC1091
  source "$dir/cluster.env"  # NSHARDS
  for ((i = 0; i <= NSHARDS; i++)); do
    port=$((baseport + i))
    psql -X -q -v ON_ERROR_STOP=1 "postgresql://postgres@127.0.0.1:$port/postgres" \
      -c "DROP DATABASE IF EXISTS shop WITH (FORCE)" -c "CREATE DATABASE shop"
  done
  for ((i = 0; i < NSHARDS; i++)); do
    owner_parts=$nparts
    ((i >= nparts)) && owner_parts=$NSHARDS
    psql_at $((baseport + 1 + i)) -v me="$i" -v nparts="$owner_parts" -v id_base="$((i * 1000000000000 + 1))" \
      -f "$here/shard.sql" >/dev/null
  done
  psql_at "$baseport" -f "$here/proxy.sql" >/dev/null
  psql_at "$baseport" -c "CREATE SERVER orders FOREIGN DATA WRAPPER plproxy OPTIONS ($(server_options "$nparts"))" \
    -c "CREATE USER MAPPING FOR PUBLIC SERVER orders" -c "GRANT USAGE ON FOREIGN SERVER orders TO PUBLIC"
}

case "$cmd" in
start)
  baseport=${3:?$usage}
  nshards=${4:?$usage}
  nparts=${5:-$nshards}
  if ! power_of_two "$nparts" || ! power_of_two "$nshards" || ((nparts > nshards)); then
    echo "plproxy_cluster: NSHARDS and NPARTS must be powers of 2, NPARTS <= NSHARDS" >&2
    exit 2
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  # The postgres user must reach the clusters' folders (mktemp -d makes 0700 ones).
  [[ $(id -u) -eq 0 ]] && chmod o+x "$dir" "$(dirname "$dir")"
  echo "$baseport" >"$dir/baseport"
  {
    echo "export PROXY_DSN='$(dsn_of "$baseport")'"
    echo "export NSHARDS=$nshards"
    for ((i = 0; i < nshards; i++)); do echo "export SHARD_DSN_$i='$(dsn_of $((baseport + 1 + i)))'"; done
  } >"$dir/cluster.env"
  conf="shared_buffers = 32MB"
  for ((i = 0; i < nshards; i++)); do
    PGCLUSTER_PRELOAD=idempotency PGCLUSTER_CONF=$conf "$root/scripts/pgcluster.sh" start "$dir/shard$i" $((baseport + 1 + i))
  done
  PGCLUSTER_PRELOAD='' PGCLUSTER_CONF=$conf "$root/scripts/pgcluster.sh" start "$dir/proxy" "$baseport"
  make_databases "$nparts"
  echo "plproxy_cluster: proxy on $baseport, $nshards shard(s) on $((baseport + 1))..$((baseport + nshards)), $nparts partition(s)"
  ;;
reset)
  nparts=${3:?$usage}
  dir=$(cd "$dir" && pwd)
  # shellcheck disable=SC1091
  source "$dir/cluster.env"  # NSHARDS
  if ! power_of_two "$nparts" || ((nparts > NSHARDS)); then
    echo "plproxy_cluster: NPARTS must be a power of 2, at most NSHARDS" >&2
    exit 2
  fi
  make_databases "$nparts"
  echo "plproxy_cluster: databases made afresh, $nparts partition(s)"
  ;;
partitions)
  nparts=${3:?$usage}
  dir=$(cd "$dir" && pwd)
  power_of_two "$nparts" || { echo "plproxy_cluster: NPARTS must be a power of 2" >&2; exit 2; }
  psql_at "$(<"$dir/baseport")" -c "ALTER SERVER orders OPTIONS ($(server_options "$nparts" alter))"
  ;;
stop)
  [[ -d $dir ]] || exit 0
  for d in "$dir"/shard* "$dir/proxy"; do
    [[ -d $d ]] && "$root/scripts/pgcluster.sh" stop "$d"
  done
  rm -rf "$dir"
  ;;
*)
  echo "$usage" >&2
  exit 2
  ;;
esac
