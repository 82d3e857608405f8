#!/usr/bin/env bash
# Fences across Citus shard moves (issue 24 part 2), by hand: a coordinator and
# two workers (tests/scale-out/citus_cluster.sh), then for keys whose rows are
# removed by cleanup between a key's two holders:
#   1. citus_move_shard_placement of a principal's shard to the other worker;
#   2. citus_drain_node of one worker (every shard on the other), then
#      rebalance_table_shards (shards back to it);
#   3. a key left in place (expired, not cleaned up) that save_final and claim
#      take over on the node the shard moved to;
# and checks that every fence handed out after a move is larger than every
# fence of the same key before it, with no setval anywhere. It also prints
# the nodes' idempotency.fences sequences, which is what 0.7.0 drew from:
# their values are far below the fences handed out, so the 0.7.0 way would
# have repeated them.
#
# Citus is not a Debian package, so this is not part of CI: run it with a
# PostgreSQL that has Citus and the extension installed (PGBIN); without citus
# it says so and exits 77 (skipped), never counted as passed.
#
#   PGBIN=/path/to/bin tests/scale-out/citus_moves.sh        CITUS_PORT (default 27220)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
# shellcheck source=SCRIPTDIR/citus_lib.bash
source tests/scale-out/citus_lib.bash
start_citus_cluster moves 27220
acquire() {  # PRINCIPAL KEY: takes the key (its row must be gone or expired), completes it; prints the fence
  local fence
  fence=$(sql 0 -c "SELECT fence FROM idempotency.acquire('$1', '$2', 'move', sha256('$2'), lease => '1 min')")
  [[ -n $fence ]] || { echo "acquire($1, $2) handed out no fence" >&2; return 1; }
  [[ $(sql 0 -c "SELECT idempotency.complete('$1', '$2', 201, fence => $fence)") == t ]] ||
    { echo "complete($1, $2, fence $fence) failed" >&2; return 1; }
  echo "$fence"
}
expire() {  # PRINCIPAL...: every key row of these principals expires now
  local list
  list=$(printf "'%s'," "$@")
  sql 0 -c "UPDATE idempotency.keys SET created_at = now() - interval '1 hour', expires_at = now() - interval '1 second'
          WHERE principal IN (${list%,}) AND action = 'move'" >/dev/null
}
cleanup_gone() {  # PRINCIPAL...: CALL cleanup on the coordinator; their rows must be gone
  local list
  list=$(printf "'%s'," "$@")
  sql 0 -c "CALL idempotency.cleanup()" >/dev/null
  [[ $(sql 0 -c "SELECT count(*) FROM idempotency.keys WHERE principal IN (${list%,}) AND action = 'move'") == 0 ]]
}
w1=$((base + 1))
w2=$((base + 2))

# 1. One principal's shard moved to the other worker, its row cleaned up between.
p=moves-1
shard=$(sql 0 -c "SELECT get_shard_id_for_distribution_column('idempotency.keys', '$p')")
from=$(worker_of "$p")
to=$((from == w1 ? w2 : w1))
f1=$(acquire "$p" k)
expire "$p"
sql 0 -c "SELECT citus_move_shard_placement($shard, '127.0.0.1', $from, '127.0.0.1', $to,
                                         shard_transfer_mode => 'block_writes')" >/dev/null
check "shard $shard of $p moved from worker $from to $to" test "$(worker_of "$p")" = "$to"
check "cleanup on the coordinator removed the moved, expired row" cleanup_gone "$p"
f2=$(acquire "$p" k)
check "after the move and cleanup the key's next fence ($f2) is above its last ($f1)" test "$f2" -gt "$f1"

# 2. Drain a worker, then rebalance: 24 principals over both workers, a row
# per principal cleaned up between each pair of holders.
principals=()
for i in $(seq 1 24); do principals+=("drain-$i"); done
declare -A last
for q in "${principals[@]}"; do last[$q]=$(acquire "$q" k); done
spread=$(for q in "${principals[@]}"; do worker_of "$q"; done | sort -u | wc -l)
check "the 24 principals start on both workers" test "$spread" = 2
higher() {  # PHASE: acquires every principal's key again; each fence must be above its last
  local q f bad=0
  for q in "${principals[@]}"; do
    f=$(acquire "$q" k)
    if ((f <= ${last[$q]})); then echo "   $1: $q fence $f after ${last[$q]}" >&2; bad=1; fi
    last[$q]=$f
  done
  return $bad
}
expire "${principals[@]}"
sql 0 -c "SELECT citus_drain_node('127.0.0.1', $w2, shard_transfer_mode => 'block_writes')" >/dev/null
spread=$(for q in "${principals[@]}"; do worker_of "$q"; done | sort -u)
check "citus_drain_node moved every shard to worker $w1" test "$spread" = "$w1"
check "cleanup removed the drained, expired rows" cleanup_gone "${principals[@]}"
check "after the drain every key's next fence is above its last" higher drain
sql 0 -c "SELECT citus_set_node_property('127.0.0.1', $w2, 'shouldhaveshards', true)" >/dev/null
expire "${principals[@]}"
sql 0 -c "SELECT rebalance_table_shards(shard_transfer_mode => 'block_writes')" >/dev/null
# (Citus's default strategy balances disk size: it moves the shards that hold
# rows, which are this run's, so any number of the 24 may move; some must.)
moved=$(for q in "${principals[@]}"; do worker_of "$q"; done | grep -c "^$w2\$" || true)
check "rebalance_table_shards moved shards of the principals back to worker $w2 ($moved of 24)" \
  test "$moved" -gt 0
check "cleanup removed the rebalanced, expired rows" cleanup_gone "${principals[@]}"
check "after the rebalance every key's next fence is above its last" higher rebalance

# 3. A row left expired (no cleanup) across a move: save_final and claim take
# it over on the new node with a fence above the row's.
for key in sf cl; do
  last[$key]=$(acquire "$p" "$key")
done
expire "$p"
from=$(worker_of "$p")
to=$((from == w1 ? w2 : w1))
shard=$(sql 0 -c "SELECT get_shard_id_for_distribution_column('idempotency.keys', '$p')")
sql 0 -c "SELECT citus_move_shard_placement($shard, '127.0.0.1', $from, '127.0.0.1', $to,
                                         shard_transfer_mode => 'block_writes')" >/dev/null
check "save_final took the expired row over after the move" test \
  "$(sql 0 -c "SELECT idempotency.save_final('$p', 'sf', 'move', sha256('sf'), 422)")" = t
check "claim took the expired row over after the move" test "$(sql 0 -c "SELECT idempotency.claim('$p', 'cl')")" = t
fence_of() { sql 0 -c "SELECT fence FROM idempotency.keys WHERE principal = '$p' AND key = '$1'"; }
check "save_final's row fence ($(fence_of sf)) is above the fence it replaced (${last[sf]})" \
  test "$(fence_of sf)" -gt "${last[sf]}"
check "claim's row fence ($(fence_of cl)) is above the fence it replaced (${last[cl]})" \
  test "$(fence_of cl)" -gt "${last[cl]}"

# What 0.7.0 would have drawn: each node's own sequence.
for i in 0 1 2; do
  echo "   node $((base + i)): idempotency.fences at $(sql "$i" -c "SELECT last_value FROM idempotency.fences")" \
       "(fences handed out here are around $f2)"
done
report
