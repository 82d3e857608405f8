#!/usr/bin/env bash
# The counters of idempotency.stats where a pg_regress file cannot go: a
# server of its own (library preloaded, idempotency.max_actions = 8) where a
# database names at most its share, ceil(8 / 4) = 2 actions, and counts its
# further ones under its own '(other)', so that a database that sends many
# action names does not move another database's new actions to '(other)'
# (0.6.0 let the first database take the whole table); then what is promised across a
# crash and a restart: the counters live in shared memory only, so crash
# recovery and a restart start them again from zero (stats_reset shows the
# time), and counting goes on at once. Port: PGPORT + 31 of the cluster of
# scripts/test.sh (IDEM_COUNTERS_PORT overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
dir=$(mktemp -d /tmp/idem-counters.XXXXXX)
sleeper=
cleanup() {
  [[ -n $sleeper ]] && kill "$sleeper" 2>/dev/null || true
  scripts/pgcluster.sh stop "$dir/pg" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
as_postgres() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
fail() { echo "FAIL: $*"; exit 1; }
PGCLUSTER_CONF="idempotency.max_actions = 8" \
  scripts/pgcluster.sh start "$dir/pg" "${IDEM_COUNTERS_PORT:-$((${PGPORT:-54329} + 31))}"
# shellcheck disable=SC1091
source "$dir/pg/env"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d idem_ctr -c "$1"; }
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE idem_ctr"
q "CREATE EXTENSION idempotency"
fp="idempotency.fingerprint('POST', '/x')"
rows() {
  psql -X -q -At -v ON_ERROR_STOP=1 -d "${1:-idem_ctr}" -c \
    "SELECT coalesce(string_agg(action || ':' || save_final_stored, ' ' ORDER BY action), '-')
       FROM idempotency.stats WHERE database = current_database()"
}

echo "--- one database sends more action names than idempotency.max_actions"
for i in $(seq 1 12); do q "SELECT idempotency.save_final('p', 'k$i', 'act$i', $fp, 422)" >/dev/null; done
q "SELECT idempotency.save_final('p', 'k13', 'act1', $fp, 422)" >/dev/null
got=$(rows)
echo "counted: $got"
[[ $got == "(other):10 act1:2 act2:1" ]] ||
  fail "expected act1, act2 (the database's share) and (other) with 10, got '$got'"
[[ $(q "SHOW idempotency.max_actions") == 8 ]] || fail "idempotency.max_actions not applied"

echo "--- another database still names its new actions"
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE idem_ctr2"
psql -X -q -v ON_ERROR_STOP=1 -d idem_ctr2 -c "CREATE EXTENSION idempotency"
for a in other1 other2 other3; do
  psql -X -q -At -v ON_ERROR_STOP=1 -d idem_ctr2 \
    -c "SELECT idempotency.save_final('p', '$a', '$a', $fp, 422)" >/dev/null
done
got=$(rows idem_ctr2)
echo "counted in idem_ctr2: $got"
[[ $got == "(other):1 other1:1 other2:1" ]] ||
  fail "expected other1, other2 named in the second database, got '$got'"
got=$(rows)
[[ $got == "(other):10 act1:2 act2:1" ]] || fail "the first database's rows moved: '$got'"
[[ $(q "SELECT count(*) FROM idempotency.stats WHERE database IS NULL AND save_final_stored > 0") == 0 ]] ||
  fail "calls counted under the server-wide (other)"

echo "--- crash recovery"
before=$(q "SELECT stats_reset FROM idempotency.stats WHERE database IS NULL")
psql -X -q -d idem_ctr -c "SELECT pg_sleep(60)" >/dev/null 2>&1 &
sleeper=$!
pid=
for _ in $(seq 1 50); do
  pid=$(q "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(60)%' AND pid <> pg_backend_pid()")
  [[ -n $pid ]] && break
  sleep 0.1
done
[[ -n $pid ]] || fail "no backend to kill"
kill -KILL "$pid"  # the postmaster ends every backend and reinitializes shared memory
wait "$sleeper" 2>/dev/null || true
sleeper=
up=
for _ in $(seq 1 120); do
  if q "SELECT 1" >/dev/null 2>&1; then up=1; break; fi
  sleep 0.5
done
[[ -n $up ]] || fail "server did not come back after the crash"
grep -q "terminated by signal 9" "$dir/pg/server.log" || fail "no crash in the server log"
got=$(rows)
echo "after the crash: $got"
[[ $got == "-" ]] || fail "counters survived a crash: '$got'"
[[ $(q "SELECT stats_reset > '$before' FROM idempotency.stats WHERE database IS NULL") == t ]] ||
  fail "stats_reset does not show the crash"
q "SELECT idempotency.save_final('p', 'k-crash', 'act9', $fp, 422)" >/dev/null
got=$(rows)
[[ $got == "act9:1" ]] || fail "counting after the crash: '$got'"

echo "--- restart"
before=$(q "SELECT stats_reset FROM idempotency.stats WHERE database IS NULL")
as_postgres "$PGBIN/pg_ctl" -D "$PGHOST/data" -l "$PGHOST/server.log" -m fast -w -t 60 restart >/dev/null
got=$(rows)
[[ $got == "-" ]] || fail "counters survived a restart: '$got'"
[[ $(q "SELECT stats_reset > '$before' FROM idempotency.stats WHERE database IS NULL") == t ]] ||
  fail "stats_reset does not show the restart"
echo "counters: ok"
