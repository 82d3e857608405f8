#!/usr/bin/env bash
# A key lock granted just as its wait runs out (the model checker found it: PG17,
# distributed mode, seed 486910400). begin(..., wait => W) waits for a key that
# another transaction holds with lock_timeout = W in a subtransaction. When the
# lock_timeout timer fires after the lock was granted and before PostgreSQL turns
# the timer off, its cancel stays pending: before the fix, begin returned
# 'started' and the caller's NEXT statement failed with 55P03 "canceling statement
# due to lock timeout", aborting the request's transaction.
#
# The interleaving, made certain with gdb: session A holds the key; session B
# waits for it (wait => 15 s); gdb stops B in disable_timeouts, the call with
# which ProcSleep turns the timers off once the lock is granted; A rolls back
# (B is granted the lock); gdb holds B until B's wait has run out, then lets it
# go, and the pending SIGALRM fires the lock timeout right there. The promise: B's
# begin answers in_progress (the wait ran out: the lock goes back), and B's
# transaction goes on (its next statement runs, its commit commits).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
command -v gdb >/dev/null || { echo "not ok - gdb is not installed"; echo "0 passed, 1 failed"; exit 1; }
# IDEM_RACE_DB: a database that has an edition already (tests/integration/
# trusted_edition.sh runs this file against the trusted edition's); else a fresh
# one with CREATE EXTENSION.
if [[ -n ${IDEM_RACE_DB:-} ]]; then
  db=$IDEM_RACE_DB
else
  fresh_database idem_lock_race
  db=$service_db
fi
# Long enough for gdb to attach on a loaded machine (6 s seen in a chroot).
wait_s=15
fp="idempotency.fingerprint('POST', '/race')"

# Session A: holds the key (begin in an open transaction) until told to roll back.
mkfifo "$work/a.in"
psql -X -q -d "$db" <"$work/a.in" >"$work/a.out" 2>&1 &
exec 3>"$work/a.in"
echo "BEGIN; SELECT (idempotency.begin('p', 'k', 'race', $fp)).outcome;" >&3
key_lock_holders() {
  psql -X -qAt -d "$db" -c \
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
}
for _ in $(seq 100); do [[ $(key_lock_holders) == 1 ]] && break; sleep 0.1; done
check "session A holds the key lock" test "$(key_lock_holders)" = 1

# Session B: waits for the key, then runs one more statement and commits.
psql -X -d "$db" >"$work/b.out" 2>&1 <<SQL &
\\set VERBOSITY sqlstate
BEGIN;
SELECT 'b-outcome:' || (idempotency.begin('p', 'k', 'race', $fp, wait => '$wait_s s')).outcome;
SELECT 'b-next:' || count(*) FROM pg_class WHERE relname = 'pg_class';
COMMIT;
SQL
b_psql=$!
b_pid=""
for _ in $(seq 100); do
  b_pid=$(psql -X -qAt -d "$db" -c \
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
  [[ -n $b_pid ]] && break
  sleep 0.1
done
check "session B waits for the key lock" test -n "$b_pid"
started=$SECONDS
# B's wait runs out wait_s after it began (about now): gdb holds B until 1 s past that.
deadline=$(($(date +%s) + wait_s + 1))

# gdb stops B where the granted wait turns its timers off, sleeps past the wait's
# end, and detaches: the SIGALRM queued meanwhile then fires the lock timeout.
gdb -p "$b_pid" -batch -nx \
  -ex 'handle SIGALRM nostop noprint pass' -ex 'handle SIGINT nostop noprint pass' \
  -ex 'handle SIGURG nostop noprint pass' -ex 'handle SIGUSR1 nostop noprint pass' \
  -ex 'break disable_timeouts' -ex "shell touch $work/gdb.ready" -ex 'continue' \
  -ex "shell touch $work/gdb.held" \
  -ex "shell while [ \$(date +%s) -le $deadline ]; do sleep 0.2; done" -ex 'detach' \
  >"$work/gdb.out" 2>&1 &
gdb_pid=$!
for _ in $(seq 300); do [[ -e $work/gdb.ready ]] && break; sleep 0.05; done
attached=$((SECONDS - started))
# A's rollback must reach B well inside its wait, or B timed out before the grant
# and the test proves nothing.
check "gdb attached to session B within $((wait_s - 3)) s of its wait (took $attached s)" \
  test -e "$work/gdb.ready" -a "$attached" -lt $((wait_s - 3))
sleep 0.5  # gdb's continue
echo "ROLLBACK;" >&3
exec 3>&-
wait "$gdb_pid" || true
wait "$b_psql" || true
cat "$work/gdb.out" "$work/b.out" >&2

check "gdb held session B at the grant (disable_timeouts)" test -e "$work/gdb.held"
check "B's begin answers in_progress: the wait ran out as it was granted" grep -q 'b-outcome:in_progress' "$work/b.out"
check "B's next statement runs (no 55P03 left pending)" grep -q 'b-next:1' "$work/b.out"
check "no error in session B" bash -c "! grep -q 'ERROR' '$work/b.out'"
check "B's transaction committed (psql printed COMMIT, not ROLLBACK)" grep -qx 'COMMIT' "$work/b.out"
check "the key lock is free again" test "$(key_lock_holders)" = 0
report
