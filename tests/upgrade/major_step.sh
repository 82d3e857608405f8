#!/usr/bin/env bash
# One step of the major-version move 15 -> 17 -> 18 that scripts/test-matrix.sh
# --major-upgrade drives, run inside the chroot of one PostgreSQL version (the
# extension installed there). PostgreSQL's own packages of 15, 17 and 18 live in
# different Debian suites (no suite has two of them), so pg_upgrade, which needs
# the old and the new server side by side, is not available: keys move with
# pg_dump (of the new version, from the old server over TCP) and pg_restore.
#
#   major_step.sh fill PORT                a 15 cluster with keys of every kind; /xfer/before.txt
#   major_step.sh move PORT FROM_PORT      a cluster on PORT, restored from the server on FROM_PORT;
#                                          checks every key, fences, ALTER EXTENSION UPDATE
#   major_step.sh stop                     stops this chroot's cluster
set -euo pipefail
cd /src
dir=/tmp/idem-major
db=idem_major
fp="idempotency.fingerprint('POST', '/x', convert_to('{}', 'UTF8'))"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" -c "$1"; }
snapshot() {
  q "SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s|%s', principal, key, state, response_status,
                              encode(response_body, 'hex'), response_headers, resource_id, one_time_secret, fence),
                       E'\n' ORDER BY principal, key) FROM idempotency.keys"
}
start() {
  scripts/pgcluster.sh stop "$dir" >/dev/null 2>&1 || true
  scripts/pgcluster.sh start "$dir" "$1" >/dev/null
  # shellcheck disable=SC1091
  source "$dir/env"
}
case $1 in
fill)
  start "$2"
  psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $db"
  q "CREATE EXTENSION idempotency"
  for i in $(seq 1 20); do  # completed keys: binary bodies (every byte value), headers, resource ids
    q "BEGIN; SELECT outcome FROM idempotency.begin('p$((i % 3))', 'done-$i', 'a', $fp);
       SELECT idempotency.complete('p$((i % 3))', 'done-$i', status => 200 + $i,
              body => decode(md5('$i') || '00ff0d0a' || repeat('7f80', $i), 'hex'),
              headers => '{\"Location\":\"/o/$i\",\"Content-Type\":\"application/octet-stream\"}',
              resource_id => 'r-$i');
       COMMIT;" >/dev/null
  done
  q "BEGIN; SELECT outcome FROM idempotency.begin('p0', 'allbytes', 'a', $fp);
     SELECT idempotency.complete('p0', 'allbytes', status => 201,
            body => (SELECT string_agg(set_byte('\\x00'::bytea, 0, b), ''::bytea ORDER BY b) FROM generate_series(0, 255) b));
     COMMIT;" >/dev/null
  q "SELECT idempotency.save_final('p1', 'secret', 'a', $fp, 403, convert_to('sk_live', 'UTF8'), one_time_secret => true)" >/dev/null
  for i in $(seq 1 5); do  # live leases, each with its fence
    q "SELECT fence FROM idempotency.acquire('p2', 'leased-$i', 'a', $fp, lease => '1 hour')" >/dev/null
  done
  q "SELECT idempotency.complete('p2', 'leased-5', fence => (SELECT fence FROM idempotency.keys WHERE key = 'leased-5'),
            status => 202, body => '\\xcafe'::bytea)" >/dev/null
  mkdir -p /xfer
  snapshot >/xfer/before.txt
  echo "ok - major: PostgreSQL $(q 'SHOW server_version') filled: $(q 'SELECT count(*) FROM idempotency.keys') keys"
  ;;
move)
  start "$2"
  from=$3
  max_before=$(psql -X -q -At -h 127.0.0.1 -p "$from" -d "$db" -c "SELECT max(fence) FROM idempotency.keys")
  dump=$(mktemp)
  chmod 644 "$dump"
  pg_dump -Fc -h 127.0.0.1 -p "$from" -d "$db" -f "$dump"  # this version's pg_dump, the old server
  psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $db"
  pg_restore -d "$db" "$dump"
  rm -f "$dump"
  [[ $(snapshot) == "$(cat /xfer/before.txt)" ]] || { echo "keys differ after the move"; diff <(snapshot) /xfer/before.txt; exit 1; }
  echo "ok - major: every key of the old server is in PostgreSQL $(q 'SHOW server_version'), byte for byte"
  for i in $(seq 1 20); do
    got=$(q "SELECT outcome || ' ' || response_status || ' ' || encode(response_body, 'hex') || ' ' || response_headers::text
               FROM idempotency.begin('p$((i % 3))', 'done-$i', 'a', $fp)")
    want="replay $((200 + i)) $(q "SELECT encode(decode(md5('$i') || '00ff0d0a' || repeat('7f80', $i), 'hex'), 'hex')") {\"Location\": \"/o/$i\", \"Content-Type\": \"application/octet-stream\"}"
    [[ $got == "$want" ]] || { echo "replay of done-$i: $got"; exit 1; }
  done
  [[ $(q "SELECT md5(response_body) FROM idempotency.begin('p0', 'allbytes', 'a', $fp)") == \
     $(q "SELECT md5(string_agg(set_byte('\\x00'::bytea, 0, b), ''::bytea ORDER BY b)) FROM generate_series(0, 255) b") ]]
  [[ $(q "SELECT outcome FROM idempotency.begin('p1', 'secret', 'a', $fp)") == secret_replay ]]
  [[ $(q "SELECT outcome FROM idempotency.acquire('p2', 'leased-1', 'a', $fp, wait => '0')") == in_progress ]]
  echo "ok - major: replays byte for byte, the one-time secret stays unkept, a live lease stays held"
  q "SELECT idempotency.forget('p2', 'leased-2')" >/dev/null
  fence=$(q "SELECT fence FROM idempotency.acquire('p2', 'leased-2', 'a', $fp, lease => '1 hour')")
  ((fence > max_before)) || { echo "fence $fence after the move, $max_before before"; exit 1; }
  q "SELECT idempotency.release('p2', 'leased-2', $fence)" >/dev/null
  snapshot >/xfer/before.txt  # what the next version must find
  echo "ok - major: fences keep growing ($max_before before, $fence after)"
  q "ALTER EXTENSION idempotency UPDATE"
  [[ $(q "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'") == "$(cat VERSION)" ]]
  echo "ok - major: ALTER EXTENSION idempotency UPDATE"
  ;;
stop)
  scripts/pgcluster.sh stop "$dir"
  ;;
esac
