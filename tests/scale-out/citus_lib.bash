# Shared by tests/scale-out/citus.sh, citus_moves.sh, citus_direct.sh and
# citus_update.sh (sourced, not run): a cluster of tests/scale-out/citus_cluster.sh
# for the run, SQL on a node of it, where a principal's key shard lives, and TAP-style checks. Needs PGBIN.

# start_citus_cluster NAME DEFAULT_PORT: exits 77 (SKIPPED) without citus; else
# starts a coordinator and two workers on CITUS_PORT (default DEFAULT_PORT) in a
# throwaway folder (sets base and work), stopped and removed at exit along with
# the script's background jobs. CITUS_CONF reaches every node's postgresql.conf.
start_citus_cluster() {
  local libdir
  libdir=$("$PGBIN/pg_config" --pkglibdir)
  if [[ ! -e $libdir/citus.so ]]; then
    echo "SKIPPED: citus is not installed in $libdir (PGBIN=$PGBIN); nothing was checked"
    exit 77
  fi
  base=${CITUS_PORT:-$2}
  work=$(mktemp -d "/tmp/idem-citus-$1.XXXXXX")
  trap 'jobs -p | xargs -r kill 2>/dev/null; tests/scale-out/citus_cluster.sh stop "$work"; rm -rf "$work"' EXIT
  tests/scale-out/citus_cluster.sh start "$work" "$base"
}

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
