#!/usr/bin/env bash
# The key on a Citus worker's own shard (issue 24 part 1), by hand: a
# coordinator and two workers (tests/scale-out/citus_cluster.sh), then
#   1. a keyed request sent to the worker that holds the principal's shard
#      reads and writes the shard relation directly: with
#      citus.log_local_commands on, Citus runs no statement on idempotency.keys_N
#      for begin and complete (with idempotency.distributed = on it does: the
#      check can fail), and the row is in the shard;
#   2. citus.enable_local_execution = off: the extension goes back to
#      statements, which Citus sends over its own connection;
#   3. a shard move waits for a transaction that holds a key of the shard (the
#      extension took Citus's shard metadata lock): the move is seen waiting
#      on it, finishes after it, and the transaction's row moved with the shard;
#   4. a keyed request that arrives on the old worker while the move waits
#      queues behind the move and then refuses with 0A000 "the key's shard is
#      not on this node" (its placement is read again after the lock), writing
#      nothing on either worker; the new worker replays the moved key, and a
#      request sent to the old worker after the move is delegated there;
#      The refusal's detail says the shard moved while the call waited for
#      it (not the setup hint);
#   5. plan_cache_mode = force_generic_plan: served on the shard's worker,
#      refused (not delegated) on another worker and on the coordinator;
#   6. idempotency.routed = on (what the routers set on their connections to
#      the workers): a prepared begin and complete keep their generic plans on
#      the shard's worker (without it Citus re-plans them at every execution:
#      no generic plan is used, the check can fail); on another worker a call
#      is delegated while its plan is custom, and refused with the detail
#      "routed here" once the plan is generic; on the coordinator the calls
#      are delegated while their plans are custom, and a generic plan (if
#      PostgreSQL picks one) is refused.
#
# Citus is not a Debian package, so this is not part of CI: run it with a
# PostgreSQL that has Citus and the extension installed (PGBIN); without citus
# it says so and exits 77 (skipped), never counted as passed.
#
#   PGBIN=/path/to/bin tests/scale-out/citus_direct.sh        CITUS_PORT (default 27240)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
# shellcheck source=SCRIPTDIR/citus_lib.bash
source tests/scale-out/citus_lib.bash
CITUS_CONF="wal_level = logical" start_citus_cluster direct 27240
w1=$((base + 1))
w2=$((base + 2))
sha="'\\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea"
# keyed PRINCIPAL KEY: the SQL of a keyed request (begin, an order, complete).
keyed() {
  cat <<SQL
BEGIN;
SELECT outcome FROM idempotency.begin('$1', '$2', 'create_order', $sha);
INSERT INTO orders (principal, item, quantity) VALUES ('$1', 'direct', 1);
SELECT idempotency.complete('$1', '$2', 201, '\\x7b7d'::bytea, '{}'::jsonb, 'ord');
COMMIT;
SQL
}
# on_port PORT ARGS...: psql on a node by port (the workers' ports are not 0-2 of sql()).
on_port() { "$PGBIN/psql" -X -q -At -h 127.0.0.1 -p "$1" -U postgres -d shop "${@:2}"; }

p=direct-1
from=$(worker_of "$p")
to=$((from == w1 ? w2 : w1))
shard=$(sql 0 -c "SELECT get_shard_id_for_distribution_column('idempotency.keys', '$p')")

# 1. The direct path on the owning worker.
log=$( { echo "SET citus.log_local_commands = on;"; keyed "$p" k1; } | on_port "$from" 2>&1)
check "begin and complete ran on worker $from" grep -q '^started' <<<"$log"
check "Citus ran no statement on the shard idempotency.keys_$shard for them (direct access)" \
  bash -c '! grep -q "idempotency.keys_'"$shard"'" <<<"$1"' _ "$log"
check "the order itself went through Citus's local execution (the log works)" \
  grep -q "orders_" <<<"$log"
log=$( { echo "SET citus.log_local_commands = on; SET idempotency.distributed = on;"; keyed "$p" k2; } |
  on_port "$from" 2>&1)
check "with idempotency.distributed = on the same request runs statements on idempotency.keys_$shard" \
  grep -q "idempotency.keys_$shard" <<<"$log"
check "both rows are in the shard relation on worker $from" equals \
  "$(on_port "$from" -c "SELECT count(*) FROM idempotency.keys_$shard WHERE principal = '$p'")" 2

# 2. Local execution off: statements over Citus's connection.
log=$( { echo "SET citus.enable_local_execution = off; SET citus.log_remote_commands = on;"; keyed "$p" k3; } |
  on_port "$from" 2>&1)
check "citus.enable_local_execution = off: the lookup is a statement Citus sends over a connection" \
  grep -q "FROM idempotency.keys_$shard" <<<"$log"
check "and the key was stored" equals \
  "$(on_port "$from" -c "SELECT state FROM idempotency.keys_$shard WHERE principal = '$p' AND key = 'k3'")" completed

# 3. A move waits for a transaction that holds a key of the shard.
holder_log=$work/holder.log
{
  keyed "$p" held | sed 's/^INSERT/SELECT pg_sleep(6); INSERT/'
} | on_port "$from" >"$holder_log" 2>&1 &
holder=$!
sleep 1
(sql 0 -c "SELECT citus_move_shard_placement($shard, '127.0.0.1', $from, '127.0.0.1', $to,
                                            shard_transfer_mode => 'force_logical')" >"$work/move.log" 2>&1
 date +%s.%N >"$work/move.done") &
mover=$!
waiting=0
for _ in $(seq 1 50); do
  waiting=$(on_port "$from" -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                                  AND mode = 'ExclusiveLock' AND NOT granted AND objsubid IN (4, 8)")
  ((waiting > 0)) && break
  sleep 0.1
done
check "the move waits for Citus's shard metadata lock on worker $from" test "$waiting" -gt 0
# 4. A keyed request on the old worker while the move waits: its begin queues
# behind the move, then refuses.
(keyed "$p" late | on_port "$from" -v ON_ERROR_STOP=1 >"$work/late.log" 2>&1 || true
 date +%s.%N >"$work/late.done") &
late_pid=$!
wait "$holder" || true
date +%s.%N >"$work/holder.done"
wait "$mover" || { cat "$work/move.log" >&2; false; }
wait "$late_pid" || true
late=$(cat "$work/late.log")
echo "$late" | sed "s/^/   late request: /" >&2
check "the holding transaction committed" grep -q '^t$' "$holder_log"
check "the move finished after it" \
  awk -v a="$(cat "$work/holder.done")" -v b="$(cat "$work/move.done")" 'BEGIN { exit !(b >= a) }'
check "the shard is now on worker $to" equals "$(worker_of "$p")" "$to"
check "the held key's row moved with the shard" equals \
  "$(on_port "$to" -c "SELECT state FROM idempotency.keys_$shard WHERE principal = '$p' AND key = 'held'")" completed
check "the begin that queued behind the move was refused: the key's shard is not on this node" \
  grep -q "the key's shard is not on this node" <<<"$late"
check "its detail says the shard moved while the call waited for it (not the setup hint)" \
  grep -q "DETAIL:  The principal's shard moved to another node (a shard move or split) while this call waited for it" <<<"$late"
check "after waiting: it ended after the holding transaction" \
  awk -v a="$(cat "$work/holder.done")" -v b="$(cat "$work/late.done")" 'BEGIN { exit !(b >= a) }'
check "and nothing of it was written on the new worker" equals \
  "$(on_port "$to" -c "SELECT count(*) FROM idempotency.keys_$shard WHERE key = 'late'")" 0
# The old placement stays until Citus's deferred drop: while it is there, it must not have the row.
old_rows=$(on_port "$from" -c "SELECT to_regclass('idempotency.keys_$shard') IS NULL")
[[ $old_rows == t ]] && old_rows=dropped ||
  old_rows=$(on_port "$from" -c "SELECT count(*) FROM idempotency.keys_$shard WHERE key = 'late'")
check "nor in the old placement on worker $from ($old_rows)" bash -c '[[ $1 == dropped || $1 == 0 ]]' _ "$old_rows"
log=$( { echo "SET citus.log_local_commands = on;"; keyed "$p" held; } | on_port "$to" 2>&1)
check "the new worker replays the moved key" grep -q '^replay' <<<"$log"
log=$( { echo "SET citus.log_local_commands = on;"; keyed "$p" k4; } | on_port "$to" 2>&1)
check "and serves a new key on its shard directly" bash -c \
  'grep -q "^started" <<<"$1" && ! grep -q "idempotency.keys_'"$shard"'" <<<"$1"' _ "$log"
# A keyed request sent to the old worker after the move (a router's stale route):
# never served from the old placement.
stale=$(keyed "$p" k5 | on_port "$from" 2>&1 || true)
echo "$stale" | sed 's/^/   stale route: /' >&2
check "a keyed request on the old worker after the move was served on the new worker (Citus delegates it)" \
  equals "$(on_port "$to" -c "SELECT count(*) FROM idempotency.keys_$shard WHERE key = 'k5'")" 1
old_rows=$(on_port "$from" -c "SELECT to_regclass('idempotency.keys_$shard') IS NULL")
[[ $old_rows == t ]] && old_rows=dropped ||
  old_rows=$(on_port "$from" -c "SELECT count(*) FROM idempotency.keys_$shard WHERE key = 'k5'")
check "and wrote nothing in the old placement ($old_rows)" bash -c '[[ $1 == dropped || $1 == 0 ]]' _ "$old_rows"

# 5. plan_cache_mode = force_generic_plan on a routed connection (docs/scale-out.md,
# "Setting it up with Citus"): served on the shard's node; refused, not
# delegated, on another node and on the coordinator.
generic() {  # PORT KEY...: prepared keyed requests under a generic plan
  local port=$1
  shift
  {
    echo "SET plan_cache_mode = force_generic_plan;"
    echo "PREPARE b(text, text) AS SELECT outcome FROM idempotency.begin(\$1, \$2, 'create_order', $sha);"
    echo "PREPARE c(text, text) AS SELECT idempotency.complete(\$1, \$2, 201, '\\x7b7d'::bytea, '{}'::jsonb, 'ord');"
    for key in "$@"; do
      echo "BEGIN; EXECUTE b('$p', '$key'); EXECUTE c('$p', '$key'); COMMIT;"
    done
  } | "$PGBIN/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d shop 2>&1
}
out=$(generic "$to" g1 g2 g3 g4 g5 g6 g7)
check "force_generic_plan on the shard's worker: seven prepared keyed requests served" \
  equals "$(grep -c '^started$' <<<"$out")" 7
check "their rows are in the shard relation there" equals \
  "$(on_port "$to" -c "SELECT count(*) FROM idempotency.keys_$shard WHERE key LIKE 'g_'")" 7
out=$(generic "$from" g8)
check "force_generic_plan on a worker without the shard: refused as a stale placement" \
  grep -q "the key's shard is not on this node" <<<"$out"
out=$(generic "$base" g9)
check "force_generic_plan on the coordinator: refused too (not delegated)" \
  grep -q "the key's shard is not on this node" <<<"$out"

# 6. idempotency.routed = on: the generic plans of the calls, and nothing else.
routed_session() {  # PORT ROUTED KEY...: prepared keyed requests, then the plans used
  local port=$1 routed=$2
  shift 2
  {
    echo "SET idempotency.routed = $routed;"
    echo "PREPARE b(text, text) AS SELECT outcome FROM idempotency.begin(\$1, \$2, 'create_order', $sha);"
    echo "PREPARE c(text, text) AS SELECT idempotency.complete(\$1, \$2, 201, '\\x7b7d'::bytea, '{}'::jsonb, 'ord');"
    for key in "$@"; do
      echo "BEGIN; EXECUTE b('$p', '$key'); EXECUTE c('$p', '$key'); COMMIT;"
    done
    echo "SELECT 'plans ' || name || ' ' || generic_plans || ' ' || custom_plans FROM pg_prepared_statements ORDER BY name;"
  } | "$PGBIN/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d shop 2>&1
}
out=$(routed_session "$to" on r1 r2 r3 r4 r5 r6 r7 r8)
echo "$out" | grep '^plans' | sed 's/^/   routed on: /' >&2
check "idempotency.routed on the shard's worker: eight prepared keyed requests served" \
  equals "$(grep -c '^started$' <<<"$out")" 8
check "begin kept its generic plan (used at least twice)" \
  awk '$1 == "plans" && $2 == "b" { exit !($3 >= 2) } END { }' <<<"$out"
check "so did complete" awk '$1 == "plans" && $2 == "c" { exit !($3 >= 2) }' <<<"$out"
out=$(routed_session "$to" off r9 r10 r11 r12 r13 r14 r15 r16)
echo "$out" | grep '^plans' | sed 's/^/   routed off: /' >&2
check "without it Citus plans begin again at every execution (no generic plan used)" \
  awk '$1 == "plans" && $2 == "b" { exit !($3 == 0 && $4 == 8) }' <<<"$out"
out=$(routed_session "$from" on r17 r17a r17b r17c r17d r17e r17f r17g)
check "idempotency.routed on a worker without the shard: once the plan is generic, refused as a stale placement" \
  grep -q "the key's shard is not on this node" <<<"$out"
check "with the detail that the shard moved after the call was routed here" \
  grep -q "after this call was routed here" <<<"$out"
out=$(routed_session "$base" on r18 r19 r20 r21 r22 r23 r24)
served=$(grep -c '^started$' <<<"$out" || true)
check "idempotency.routed on the coordinator: delegated while its plans are custom ($served of 7 served)" \
  test "$served" -ge 5
check "a generic plan there is refused, not run on the coordinator (fails closed)" \
  bash -c '[[ $1 == 7 ]] || grep -q "the key'"'"'s shard is not on this node" <<<"$2"' _ "$served" "$out"
report
