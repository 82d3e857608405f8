#!/usr/bin/env bash
# The HTTP conformance suite against a Citus cluster: a coordinator and two
# workers started here (throwaway clusters, scripts/pgcluster.sh), the
# extension distributed with idempotency.distribute(), the orders and api_keys
# tables of examples/python-orders distributed by principal and co-located with
# the key table, the Python example service pointed at the coordinator, then
# tests/conformance/conformance.py, and checks that the key rows are on the
# workers' shards (nothing in the shell tables), that a transaction spanning
# two nodes commits both keys, and that cleanup on the coordinator reaches every shard.
#
# Citus is not a Debian package, so this is not part of CI: run it by hand
# with a PostgreSQL that has Citus installed (PGBIN, default: the bindir of
# PG_CONFIG or of pg_config on PATH; the extension must be installed there too).
# Without citus it says so and exits 77 (skipped) - never counted as passed.
#
#   PGBIN=/path/to/bin tests/scale-out/citus.sh        CITUS_PORT (default 27200)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
libdir=$("$PGBIN/pg_config" --pkglibdir)
sharedir=$("$PGBIN/pg_config" --sharedir)
if [[ ! -e $libdir/citus.so || ! -e $sharedir/extension/citus.control ]]; then
  echo "SKIPPED: citus is not installed in $libdir (PGBIN=$PGBIN); nothing was checked"
  exit 77
fi
if [[ ! -e $libdir/idempotency.so ]]; then
  echo "idempotency is not installed in $libdir: make install PG_CONFIG=$PGBIN/pg_config" >&2
  exit 1
fi

base=${CITUS_PORT:-27200}
work=$(mktemp -d /tmp/idem-citus.XXXXXX)
nodes=(coordinator worker1 worker2)
service_pid=""
cleanup() {
  [[ -n $service_pid ]] && kill "$service_pid" 2>/dev/null || true
  if [[ -n ${CITUS_SHOW_LOG:-} && -f $work/service.log ]]; then tail -80 "$work/service.log"; fi
  tests/scale-out/citus_cluster.sh stop "$work"
  rm -rf "$work"
}
trap cleanup EXIT

tests/scale-out/citus_cluster.sh start "$work" "$base"
# shellcheck source=SCRIPTDIR/citus_lib.bash
source tests/scale-out/citus_lib.bash
sql 0 -c "SELECT idempotency.distribute('orders')" >/dev/null  # a second run changes nothing

check "the key table is hash-distributed by principal, co-located with orders" equals \
  "$(sql 0 -c "SELECT p.partmethod, column_to_column_name(p.logicalrelid, p.partkey),
                      p.colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass)
                 FROM pg_dist_partition p WHERE logicalrelid = 'idempotency.keys'::regclass")" "h|principal|t"
check "every function that takes a principal (the batches too) is delegated by principal" equals \
  "$(sql 0 -c "SELECT string_agg(DISTINCT p.proname, ',' ORDER BY p.proname)
                 FROM pg_dist_object o JOIN pg_proc p ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                WHERE p.pronamespace = 'idempotency'::regnamespace AND o.distribution_argument_index = 0
                  AND o.force_delegation")" "acquire,begin,begin_batch,claim,claim_batch,complete,complete_batch,forget,lookup,release,renew,save_final"

# The example service against the coordinator, and the conformance suite.
svc_port=$((base + 10))
dsn="host=127.0.0.1 port=$base dbname=shop user=postgres"
/usr/bin/python3 examples/python-orders/app.py --port "$svc_port" --dsn "$dsn" 2>"$work/service.log" &
service_pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$svc_port/health" >/dev/null && break; sleep 0.1; done
check "HTTP conformance suite through the coordinator" \
  /usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$svc_port" --dsn "$dsn"

# Where the rows are: all on the shards, none in any node's shell table.
total=$(sql 0 -c "SELECT count(*) FROM idempotency.keys")
on_shards=$(sql 0 -c "SELECT sum(result::bigint) FROM run_command_on_placements('idempotency.keys', 'SELECT count(*) FROM %s')")
check "key rows were written ($total), all of them in the shards ($on_shards)" \
  bash -c "(( $total > 0 && $total == $on_shards ))"
for i in 0 1 2; do
  check "no row in the shell table idempotency.keys on ${nodes[$i]}" equals \
    "$(sql "$i" -c "SELECT pg_relation_size('idempotency.keys')")" "0"
done
# A transaction that spans two nodes: each delegated begin() goes to its own
# node, the coordinator commits both with two-phase commit.
pa=span-a
pb=""
for i in $(seq 1 50); do
  if [[ $(worker_of "span-$i") != $(worker_of "$pa") ]]; then pb=span-$i; break; fi
done
check "two principals on different workers ($pa on $(worker_of "$pa"), $pb on $(worker_of "${pb:-none}"))" test -n "$pb"
span_out=$(sql 0 2>&1 <<SQL || true
BEGIN;
SELECT outcome FROM idempotency.begin('$pa', 'k', 'span', sha256('a'));
INSERT INTO orders (principal, item, quantity) VALUES ('$pa', 'span', 1);
SELECT outcome FROM idempotency.begin('$pb', 'k', 'span', sha256('b'));
INSERT INTO orders (principal, item, quantity) VALUES ('$pb', 'span', 1);
SELECT idempotency.complete('$pa', 'k', 201);
SELECT idempotency.complete('$pb', 'k', 201);
COMMIT;
SQL
)
echo "$span_out" | sed 's/^/   /'
check "both keys and both orders of the two-node transaction committed" equals \
  "$(sql 0 -c "SELECT (SELECT count(*) FROM idempotency.keys WHERE action = 'span')
                  || ',' || (SELECT count(*) FROM orders WHERE item = 'span')")" "2,2"
check "and a retry of each replays" equals \
  "$(sql 0 -c "SELECT outcome || response_status FROM idempotency.begin('$pa', 'k', 'span', sha256('a'))"),$(
     sql 0 -c "SELECT outcome || response_status FROM idempotency.begin('$pb', 'k', 'span', sha256('b'))")" \
  "replay201,replay201"

# Cleanup from the coordinator reaches every shard.
sql 0 -c "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at, fence)
          SELECT 'old-' || i, 'k', 'old', decode(repeat('00', 32), 'hex'), 'completed', 200,
                 now() - interval '2 days', now() - interval '1 day', i FROM generate_series(1, 40) i" >/dev/null
check "CALL idempotency.cleanup() on the coordinator deletes expired rows on every shard" equals \
  "$(sql 0 -c "CALL idempotency.cleanup()" >/dev/null && sql 0 -c "SELECT count(*) FROM idempotency.keys WHERE action = 'old'")" "0"

# 0.8.0 under Citus: a refusing action's expired keys become tombstones on their
# shards (cleanup on the coordinator; the policies are a reference table) and a
# retry is told expired; the other action's expired keys are deleted.
sql 0 -c "SELECT idempotency.set_expiry_policy('refund', 'refuse', '1 day')" >/dev/null
for i in 1 2 3 4 5 6; do
  sql 0 >/dev/null <<SQL
BEGIN;
SELECT outcome FROM idempotency.begin('tomb-$i', 'r', 'refund', sha256('r'));
SELECT idempotency.complete('tomb-$i', 'r', 201);
SELECT outcome FROM idempotency.begin('tomb-$i', 'c', 'charge', sha256('c'));
SELECT idempotency.complete('tomb-$i', 'c', 201);
COMMIT;
SQL
done
sql 0 -c "UPDATE idempotency.keys SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour'
           WHERE principal LIKE 'tomb-%'" >/dev/null
sql 0 -c "CALL idempotency.cleanup()" >/dev/null
check "cleanup kept the refusing action's six keys as tombstones and deleted the other six" equals \
  "$(sql 0 -c "SELECT string_agg(DISTINCT key || ':' || state || ':' || (response_status IS NULL), ',')
                    || ',' || count(*) FROM idempotency.keys WHERE principal LIKE 'tomb-%'")" "r:expired:true,6"
check "a retry of a tombstone's request is told expired" equals \
  "$(sql 0 -c "SELECT outcome FROM idempotency.begin('tomb-3', 'r', 'refund', sha256('r'))")" "expired"
sql 0 -c "DELETE FROM idempotency.expiry_policies" >/dev/null
# Batches are delegated like the single calls: one principal's keys on its node.
batch_out=$(sql 0 <<'SQL'
BEGIN;
SELECT array_agg(outcome ORDER BY ord) FROM idempotency.begin_batch('batch-1', ARRAY['a', 'b'], 'act',
                                                                    ARRAY[sha256('a'), sha256('b')]);
SELECT array_agg(completed ORDER BY ord) FROM idempotency.complete_batch('batch-1', ARRAY['a', 'b'],
                                                                         ARRAY[201, 201]);
COMMIT;
SELECT array_agg(outcome ORDER BY ord) FROM idempotency.begin_batch('batch-1', ARRAY['a', 'b'], 'act',
                                                                    ARRAY[sha256('a'), sha256('x')]);
SELECT array_agg(claimed ORDER BY ord) FROM idempotency.claim_batch('batch-2', ARRAY['c', 'd']);
SQL
)
check "begin_batch, complete_batch and claim_batch through the coordinator" equals \
  "$(echo "$batch_out" | tr '\n' ' ')" "{started,started} {t,t} {replay,mismatch} {t,t} "
# The Go, Node and Rust clients' begin_batch statement computes the fingerprints
# in a subquery among the call's arguments, a form Citus does not delegate: on the
# coordinator it must be refused (0A000, the form named), never run there, and
# write nothing (docs/scale-out.md: their batches go through the Router).
subquery_batch="PREPARE subquery_batch(text, text[], text, text[], text[], bytea[]) AS
SELECT b.ord, b.outcome FROM idempotency.begin_batch(\$1, \$2::text[], \$3,
    ARRAY(SELECT idempotency.fingerprint(u.m, u.p, u.b)
            FROM unnest(\$4::text[], \$5::text[], \$6::bytea[]) WITH ORDINALITY AS u(m, p, b, n) ORDER BY u.n)) AS b
 ORDER BY b.ord;"
subquery_run="EXECUTE subquery_batch('batch-3', ARRAY['e', 'f'], 'act', ARRAY['POST', 'POST'], ARRAY['/o', '/o'],
                       ARRAY['{\"a\":1}'::bytea, '{\"a\":2}'::bytea]);"
refused=$(sql 0 -v ON_ERROR_STOP=0 2>&1 <<SQL
\\set VERBOSITY verbose
$subquery_batch
$subquery_run
SQL
)
check "a batch with its fingerprints in a subquery is refused through the coordinator (0A000, its form named)" \
  bash -c '[[ $1 == *"ERROR:  0A000: the key'"'"'s shard is not on this node"* && $1 == *"Citus delegates a call alone in its statement"* ]]' _ "$refused"
check "and it wrote nothing" equals \
  "$(sql 0 -c "SELECT count(*) FROM idempotency.keys WHERE principal = 'batch-3'")" "0"
# On the worker that holds the principal's shard (where the clients' routers send
# it) the same statement runs there, nothing to delegate, and its keys commit.
batch_node=$(( $(worker_of batch-3) - base ))
check "the same batch on the shard's worker (the router's connection) starts both keys" equals \
  "$(sql "$batch_node" <<SQL | tr '\n' ' '
$subquery_batch
BEGIN;
$subquery_run
SELECT ord, completed FROM idempotency.complete_batch('batch-3', ARRAY['e', 'f'], ARRAY[201, 201]);
COMMIT;
SELECT count(*) FROM idempotency.keys WHERE principal = 'batch-3';
SQL
)" "1|started 2|started 1|t 2|t 2 "
# The C++ and Python clients' form (fingerprints a parameter, each answer from
# http_answer in CASE columns) is delegated: a second run replays with the answer.
param_batch="PREPARE param_batch(text, text[], text, bytea[]) AS
SELECT b.ord, b.outcome,
       CASE WHEN b.outcome <> 'started' THEN (idempotency.http_answer(b, 'https://t.invalid/', 1)).status END
  FROM idempotency.begin_batch(\$1, \$2::text[], \$3, \$4::bytea[]) AS b ORDER BY b.ord;"
param_run="EXECUTE param_batch('batch-4', ARRAY['g', 'h'], 'act', ARRAY[sha256('g'), sha256('h')]);"
check "the C++ and Python clients' batch statement is delegated through the coordinator" equals \
  "$(sql 0 <<SQL | tr '\n' ' '
$param_batch
BEGIN;
$param_run
SELECT ord, key, completed FROM idempotency.complete_batch('batch-4', ARRAY['g', 'h'], ARRAY[201, 201]);
COMMIT;
$param_run
SQL
)" "1|started| 2|started| 1|g|t 2|h|t 1|replay|201 2|replay|201 "
# A complete_batch in a form Citus does not delegate (a WHERE on its rows) runs
# on the coordinator, which never saw the begin_batch delegated to the worker:
# the error says that this node does not hold the principal's shard (55000, the
# delegable form named), and nothing is stored.
undelegated=$(sql 0 -v ON_ERROR_STOP=0 2>&1 <<SQL
\\set VERBOSITY verbose
$param_batch
BEGIN;
EXECUTE param_batch('batch-5', ARRAY['i'], 'act', ARRAY[sha256('i')]);
SELECT count(*) FROM idempotency.complete_batch('batch-5', ARRAY['i'], ARRAY[201]) WHERE completed;
COMMIT;
SQL
)
check "a complete_batch that Citus does not delegate is told so (55000: this node does not hold the principal's shard)" \
  bash -c '[[ $1 == *"ERROR:  55000: idempotency key was not started in this transaction"* && $1 == *"This node does not hold the principal'"'"'s shard"* ]]' _ "$undelegated"
check "and nothing of it was stored" equals \
  "$(sql 0 -c "SELECT count(*) FROM idempotency.keys WHERE principal = 'batch-5'")" "0"

report
