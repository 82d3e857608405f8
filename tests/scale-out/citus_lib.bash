# Shared by tests/scale-out/citus.sh and citus_moves.sh (sourced, not run): SQL on
# a node of the cluster tests/scale-out/citus_cluster.sh started at $base, where a
# principal's key shard lives, and TAP-style checks. Needs PGBIN and base.

# sql NODE_INDEX ARGS...: psql in database shop on node 0 (coordinator), 1 or 2
# (workers), unaligned, stopping on the first error.
# shellcheck disable=SC2154 # base is the caller's
sql() {
  local node=$1
  shift
  "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -At -h 127.0.0.1 -p $((base + node)) -U postgres -d shop "$@"
}

# worker_of PRINCIPAL: the port of the worker that holds its key shard.
worker_of() {
  sql 0 -c "SELECT n.nodeport FROM pg_dist_placement pl JOIN pg_dist_node n ON n.groupid = pl.groupid
             WHERE pl.shardid = get_shard_id_for_distribution_column('idempotency.keys', '$1')"
}

passes=0
failures=0
# check DESCRIPTION COMMAND...: runs the command; prints ok / not ok and counts.
check() {
  local what=$1
  shift
  if "$@"; then echo "ok - $what"; passes=$((passes + 1)); else echo "not ok - $what"; failures=$((failures + 1)); fi
}
# equals GOT WANT: true when equal, else both printed.
equals() { [[ $1 == "$2" ]] || { echo "   expected: $2" >&2; echo "   got:      $1" >&2; return 1; }; }

# report: the summary line; fails when a check failed.
report() {
  echo "$passes passed, $failures failed"
  ((failures == 0))
}
