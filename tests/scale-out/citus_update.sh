#!/usr/bin/env bash
# The updates 0.7.0 -> 0.8.0 -> 0.9.0 under Citus, by hand: a coordinator and two
# workers (tests/scale-out/citus_cluster.sh) with the extension created at
# 0.7.0 and distributed, keys written (live ones through the protocol, expired
# ones by hand on every shard), then ALTER EXTENSION idempotency UPDATE TO
# '0.8.0' on the coordinator:
#   1. the update succeeds (Citus sends each DDL statement of the script on the
#      distributed key table to the shards and runs the whole script again on
#      every worker: with the CHECKs of 0.8.0 in one ALTER TABLE it failed, and
#      with the statements run as the script's text too);
#   2. every node is at 0.8.0, and every shard has the index cleanup walks
#      (expires_at cut to 10 ms), not 0.7.0's, and the CHECK of tombstones;
#   3. a key written before the update is replayed after it;
#   4. cleanup finds the expired rows of every shard through the new index;
#   5. after idempotency.distribute() again (docs/operations.md), an action
#      that refuses keeps tombstones, and a retry of one is told expired;
#   6. then ALTER EXTENSION idempotency UPDATE (to 0.9.0, the default version):
#      every node at 0.9.0 with idempotency.http_answer, and a key written at
#      0.7.0 answered through the coordinator in the statement the clients send
#      (begin with http_answer as CASE columns: delegated to the shard's worker,
#      a replay with its marker), a tombstone's retry answered 410.
#
# Citus is not a Debian package, so this is not part of CI: run it with a
# PostgreSQL that has Citus and the extension installed (PGBIN); without citus
# it says so and exits 77 (skipped), never counted as passed.
#
#   PGBIN=/path/to/bin tests/scale-out/citus_update.sh        CITUS_PORT (default 27280)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
# shellcheck source=SCRIPTDIR/citus_lib.bash
source tests/scale-out/citus_lib.bash
IDEM_VERSION=0.7.0 start_citus_cluster update 27280
sha="'\\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea"

check "the cluster starts at 0.7.0" equals "$(sql 0 -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" 0.7.0
# A live key through the protocol (delegated to its shard's worker).
sql 0 >/dev/null <<SQL
BEGIN;
SELECT outcome FROM idempotency.begin('upd-alice', 'k1', 'create_order', $sha);
SELECT idempotency.complete('upd-alice', 'k1', 201, '\\x7b226964223a317d'::bytea, '{}'::jsonb, 'ord_1');
COMMIT;
SQL
# Expired keys of 200 principals (so on every shard): 300 of an action that
# will refuse, 300 of one that will not.
sql 0 -c "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status,
                                        created_at, expires_at)
          SELECT 'upd-' || (i % 200), 'old-' || i, CASE WHEN i % 2 = 0 THEN 'charge' ELSE 'note' END,
                 $sha, 'completed', 200, now() - interval '3 days',
                 now() - interval '1 day' + i * interval '1 ms'
            FROM generate_series(1, 600) AS i"

# 1. The update.
out=$(sql 0 -c "ALTER EXTENSION idempotency UPDATE TO '0.8.0'" 2>&1) && rc=0 || rc=$?
check "ALTER EXTENSION idempotency UPDATE TO '0.8.0' on the coordinator succeeds" equals "$rc ${out:-}" "0 "

# 2. Every node and every shard.
for node in 0 1 2; do
  check "node $node is at 0.8.0" \
    equals "$(sql "$node" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" 0.8.0
done
shards=$(sql 0 -c "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'idempotency.keys'::regclass")
# per_shard SQL: the number SQL counts on each worker's shard tables (not the
# worker's copy of the distributed table; Citus hides shards from pg_class unless
# told not to), summed.
per_shard() {
  local total=0 node
  for node in 1 2; do
    total=$((total + $(sql "$node" -c "SET citus.override_table_visibility TO off" -c "$1")))
  done
  echo "$total"
}
shard_tables="SELECT c.oid FROM pg_class AS c WHERE c.relnamespace = 'idempotency'::regnamespace
                AND c.relkind = 'r' AND c.relname ~ '^keys_[0-9]+\$'"
check "each of the $shards shards has the index on expires_at cut to 10 ms" \
  equals "$(per_shard "SELECT count(*) FROM pg_index AS i WHERE i.indrelid IN ($shard_tables)
                         AND pg_get_indexdef(i.indexrelid) LIKE '%date_bin(''00:00:00.01''::interval, expires_at%'")" \
  "$shards"
check "no shard keeps 0.7.0's index on expires_at" \
  equals "$(per_shard "SELECT count(*) FROM pg_index AS i JOIN pg_class AS x ON x.oid = i.indexrelid
                         WHERE i.indrelid IN ($shard_tables) AND x.relname LIKE 'keys_expires_at_idx%'")" 0
check "each shard has the CHECK of tombstones and accepts the state expired" \
  equals "$(per_shard "SELECT count(*) FROM pg_constraint AS c WHERE c.conrelid IN ($shard_tables)
                         AND (c.conname LIKE 'keys_expired_keeps_nothing%'
                              OR (c.conname LIKE 'keys_state_check%' AND pg_get_constraintdef(c.oid) LIKE '%expired%'))")" \
  $((shards * 2))

# 3. The key written before the update.
check "a key written at 0.7.0 is replayed at 0.8.0" \
  equals "$(sql 0 -c "SELECT outcome || ' ' || response_status FROM idempotency.begin('upd-alice', 'k1', 'create_order', $sha)")" \
  "replay 201"

# 4. Cleanup through the new index, on every shard.
sql 0 -c "CALL idempotency.cleanup(batch_size => 100)" >/dev/null
check "cleanup deleted the 600 expired rows of every shard" \
  equals "$(sql 0 -c "SELECT count(*) FROM idempotency.keys WHERE expires_at <= now()")" 0

# 5. Tombstones after distribute() again.
sql 0 -c "SELECT idempotency.distribute(colocate_with => 'orders')" >/dev/null 2>&1
check "distribute() again makes expiry_policies a reference table" \
  equals "$(sql 0 -c "SELECT partmethod FROM pg_dist_partition WHERE logicalrelid = 'idempotency.expiry_policies'::regclass")" n
sql 0 -c "SELECT idempotency.set_expiry_policy('charge', 'refuse', '30 days')" >/dev/null
sql 0 -c "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status,
                                        created_at, expires_at)
          SELECT 'upd-' || (i % 200), 'later-' || i, CASE WHEN i % 2 = 0 THEN 'charge' ELSE 'note' END,
                 $sha, 'completed', 200, now() - interval '3 days', now() - interval '1 day' + i * interval '1 ms'
            FROM generate_series(1, 600) AS i"
sql 0 -c "CALL idempotency.cleanup(batch_size => 100)" >/dev/null
check "cleanup kept the refusing action's 300 keys as tombstones and deleted the other 300" \
  equals "$(sql 0 -c "SELECT count(*) FILTER (WHERE state = 'expired') || ' ' || count(*)
                        FROM idempotency.keys WHERE key LIKE 'later-%'")" "300 300"
check "a retry of a tombstone's request is told expired" \
  equals "$(sql 0 -c "SELECT outcome FROM idempotency.begin('upd-2', 'later-2', 'charge', $sha)")" expired

# 6. On to 0.9.0.
out=$(sql 0 -c "ALTER EXTENSION idempotency UPDATE" 2>&1) && rc=0 || rc=$?
check "ALTER EXTENSION idempotency UPDATE (to 0.9.0) on the coordinator succeeds" equals "$rc ${out:-}" "0 "
for node in 0 1 2; do
  check "node $node is at 0.9.0 and has idempotency.http_answer" \
    equals "$(sql "$node" -c "SELECT e.extversion || ' ' || count(p.oid) FROM pg_extension AS e
                                LEFT JOIN pg_proc AS p ON p.proname = 'http_answer'
                                 AND p.pronamespace = 'idempotency'::regnamespace
                               WHERE e.extname = 'idempotency' GROUP BY e.extversion")" "0.9.0 2"
done
# The statement form every client sends (client/rust/src/statements.rs BEGIN_SQL, for one):
# SELECT ... FROM idempotency.begin(...) AS o with the answer as CASE columns.
answer_of() {
  sql 0 -c "SELECT o.outcome || ' ' || coalesce((CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o)).status END)::text, '-')
                   || ' ' || coalesce((CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o)).headers END)::text, '-')
              FROM idempotency.begin('$1', '$2', '$3', $sha) AS o"
}
got=$(answer_of upd-alice k1 create_order)
check "a key written at 0.7.0 is answered at 0.9.0 through the coordinator: a 201 replay with its marker" \
  bash -c '[[ $1 == "replay 201 "* && $1 == *"[\"Idempotent-Replay\", \"true\"]"* ]] || { echo "   got: $1" >&2; false; }' _ "$got"
got=$(answer_of upd-2 later-2 charge)
check "a tombstone's retry is answered 410 at 0.9.0" \
  bash -c '[[ $1 == "expired 410 "* ]] || { echo "   got: $1" >&2; false; }' _ "$got"

report
