#!/usr/bin/env bash
# Fences never repeat for a key (issue 11, item 1), across the two events a
# pg_regress file cannot show: a crash (pg_ctl -m immediate, then recovery) and
# pg_dump / pg_restore into a new database. Also: every stored response, lease
# and fence survives the dump byte for byte, and so do expiry policies and
# tombstones (0.8.0: a restored tombstone still answers expired). Runs against the cluster of
# scripts/test.sh (PGHOST is its folder, the data directory is PGHOST/data).
set -euo pipefail
cd "$(dirname "$0")/../.."
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
db=idem_fences
restored=idem_fences_restored
dump=$(mktemp)
chmod 644 "$dump"
cleanup() {
  rm -f "$dump"
  psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
    -c "DROP DATABASE IF EXISTS $restored WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }
as_postgres() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
fail() { echo "FAIL: $*"; exit 1; }

psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $db" -c "DROP DATABASE IF EXISTS $restored" \
  -c "CREATE DATABASE $db"
q "$db" "CREATE EXTENSION idempotency"
fp="idempotency.fingerprint('POST', '/x', convert_to('{}', 'UTF8'))"

echo "--- crash recovery"
q "$db" "SELECT fence FROM idempotency.acquire('p', 'crash', 'a', $fp, lease => '10 min')" >/dev/null
# More committed acquires than the sequence logs ahead (32), each in its own
# transaction, under synchronous_commit = off: acquire() commits synchronously
# all the same, so after the crash the sequence is past every fence handed out.
for i in $(seq 1 40); do
  echo "SELECT idempotency.acquire('p', 'other-$i', 'a', $fp, lease => '10 min');"
done | PGOPTIONS="-c synchronous_commit=off" psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" >/dev/null
first=$(q "$db" "SELECT max(fence) FROM idempotency.keys")
as_postgres "$PGBIN/pg_ctl" -D "$PGHOST/data" -m immediate -w stop >/dev/null
as_postgres "$PGBIN/pg_ctl" -D "$PGHOST/data" -l "$PGHOST/server.log" -w -t 60 start >/dev/null
q "$db" "SELECT idempotency.forget('p', 'crash')" >/dev/null
second=$(q "$db" "SELECT fence FROM idempotency.acquire('p', 'crash', 'a', $fp, lease => '10 min')")
echo "highest fence before the crash $first, after the crash and forget $second"
((second > first)) || fail "a fence repeated after crash recovery"
[[ $(q "$db" "SELECT count(*) FROM idempotency.keys WHERE key LIKE 'other-%'") == 40 ]] || fail "a committed lease was lost"

echo "--- dump and restore"
q "$db" "BEGIN; SELECT outcome FROM idempotency.begin('p', 'stored', 'a', $fp);
         SELECT idempotency.complete('p', 'stored', 201, '\\x00ff0a7b7d'::bytea, '{\"Location\":\"/o/1\"}', 'r-1');
         COMMIT;" >/dev/null
q "$db" "SELECT idempotency.save_final('p', 'secret', 'a', $fp, 403, convert_to('sk', 'UTF8'), one_time_secret => true)" >/dev/null
# An expiry policy (0.8.0) and a tombstone of its action: both are data the dump keeps.
q "$db" "SELECT idempotency.set_expiry_policy('pay', 'refuse', grace => '3 days')" >/dev/null
q "$db" "BEGIN; SELECT outcome FROM idempotency.begin('p', 'tomb', 'pay', $fp);
         SELECT idempotency.complete('p', 'tomb', 201); COMMIT;" >/dev/null
q "$db" "UPDATE idempotency.keys SET created_at = now() - interval '2 days', expires_at = now() - interval '1 day'
          WHERE key = 'tomb'"
q "$db" "SELECT deleted FROM idempotency.cleanup_batch(1000)" >/dev/null
[[ $(q "$db" "SELECT state FROM idempotency.keys WHERE key = 'tomb'") == expired ]] || fail "no tombstone to dump"
policies="SELECT string_agg(format('%s %s %s', action, on_expiry, grace), ', ') FROM idempotency.expiry_policies"
policies_before=$(q "$db" "$policies")
before=$(q "$db" "SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s', key, state, response_status, encode(response_body, 'hex'),
                                      response_headers, one_time_secret, fence), ' ' ORDER BY key) FROM idempotency.keys")
max_before=$(q "$db" "SELECT max(fence) FROM idempotency.keys")
pg_dump -Fc -d "$db" -f "$dump"
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $restored"
pg_restore -d "$restored" "$dump"
after=$(q "$restored" "SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s', key, state, response_status, encode(response_body, 'hex'),
                                      response_headers, one_time_secret, fence), ' ' ORDER BY key) FROM idempotency.keys")
[[ "$before" == "$after" ]] || fail "keys differ after restore: '$before' vs '$after'"
policies_after=$(q "$restored" "$policies")
echo "expiry policies before the dump: $policies_before; after the restore: $policies_after"
[[ $policies_before == "$policies_after" ]] || fail "expiry policies differ after restore"
tomb=$(q "$restored" "SELECT outcome FROM idempotency.begin('p', 'tomb', 'pay', $fp)")
[[ $tomb == expired ]] || fail "the restored tombstone answers $tomb, not expired"
replay=$(q "$restored" "SELECT outcome || ' ' || response_status || ' ' || encode(response_body, 'hex')
                        FROM idempotency.begin('p', 'stored', 'a', $fp)")
[[ $replay == "replay 201 00ff0a7b7d" ]] || fail "replay after restore: $replay"
q "$restored" "SELECT idempotency.forget('p', 'crash')" >/dev/null
restored_fence=$(q "$restored" "SELECT fence FROM idempotency.acquire('p', 'crash', 'a', $fp, lease => '10 min')")
echo "highest fence before the dump $max_before, first after the restore $restored_fence"
((restored_fence > max_before)) || fail "a fence repeated after dump and restore"
echo "fences survive: ok"
