#!/usr/bin/env bash
# A Citus cluster for tests/scale-out/citus.sh and bench/scale-out/citus.sh:
# a coordinator and two workers on loopback (throwaway clusters of
# scripts/pgcluster.sh, citus and idempotency preloaded), database shop with
# Citus on every node, the workers added, the extension created on the
# coordinator (Citus creates it on the workers), the tables of
# examples/python-orders distributed by principal, and idempotency.distribute().
#
#   tests/scale-out/citus_cluster.sh start DIR BASEPORT   (ports BASEPORT..+2)
#   tests/scale-out/citus_cluster.sh stop DIR
#
# PGBIN names a PostgreSQL with Citus and pg_idempotency installed; CITUS_CONF
# adds postgresql.conf lines on every node (wal_level = logical for moves by
# logical replication); IDEM_VERSION creates the extension at that
# version (default: the newest).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
cmd=${1:?usage: citus_cluster.sh start DIR BASEPORT | stop DIR}
dir=${2:?usage: citus_cluster.sh start DIR BASEPORT | stop DIR}
nodes=(coordinator worker1 worker2)

if [[ $cmd == stop ]]; then
  for n in "${nodes[@]}"; do scripts/pgcluster.sh stop "$dir/$n" >/dev/null 2>&1 || true; done
  exit 0
fi
base=${3:?usage: citus_cluster.sh start DIR BASEPORT}
mkdir -p "$dir"
chmod 755 "$dir"
for i in 0 1 2; do
  # Two-phase commit for transactions over several workers; no TLS between the nodes on loopback.
  PGCLUSTER_PRELOAD='citus,idempotency' \
    PGCLUSTER_CONF="max_prepared_transactions = 100
citus.node_conninfo = 'sslmode=disable'
${CITUS_CONF:-}" \
    scripts/pgcluster.sh start "$dir/${nodes[$i]}" $((base + i)) >/dev/null
done
psql_() { "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -At -h 127.0.0.1 -U postgres "$@"; }
for i in 0 1 2; do
  psql_ -p $((base + i)) -d postgres -c "CREATE DATABASE shop"
  psql_ -p $((base + i)) -d shop -c "CREATE EXTENSION citus"
done
psql_ -p "$base" -d shop >/dev/null <<SQL
SELECT citus_set_coordinator_host('127.0.0.1', $base);
SELECT 1 FROM citus_add_node('127.0.0.1', $((base + 1)));
SELECT 1 FROM citus_add_node('127.0.0.1', $((base + 2)));
CREATE EXTENSION idempotency${IDEM_VERSION:+ VERSION '$IDEM_VERSION'};
-- The example's tables, with the distribution column in their primary keys.
-- created_at is kept as text here: the example answers RETURNING created_at::text,
-- and Citus allows only immutable expressions in a RETURNING clause (a text
-- column's ::text is no function at all; now()::text as the default is
-- evaluated before the INSERT is routed).
CREATE TABLE orders (id bigserial, principal text NOT NULL, item text NOT NULL, quantity int NOT NULL,
                     created_at text NOT NULL DEFAULT now()::text, PRIMARY KEY (principal, id));
CREATE TABLE api_keys (id bigserial, principal text NOT NULL, name text NOT NULL,
                       created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (principal, id));
SELECT create_distributed_table('orders', 'principal');
SELECT create_distributed_table('api_keys', 'principal', colocate_with => 'orders');
SELECT idempotency.distribute(colocate_with => 'orders');
SQL
echo "citus_cluster: coordinator 127.0.0.1:$base, workers $((base + 1)) $((base + 2)), database shop"
