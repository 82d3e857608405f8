#!/usr/bin/env bash
# The trusted edition (make trusted) on a throwaway cluster that does NOT
# preload our library (shared_preload_libraries = 'pg_cron' only):
#   1. a database owner who is not a superuser installs it with psql -f, and
#      no function of it is in C;
#   2. the pg_tle form installs through a stand-in pgtle.install_extension
#      (the body between its dollar quotes runs as the owner);
#   3. pg_regress and the isolation specs that apply (tests/trusted: the
#      C++ edition's expected files, and the trusted edition's own for the
#      documented differences; tests/trusted/refused_at_use.awk after each SET);
#   4. jcs and fingerprint give the C++ edition's bytes (tests/trusted/
#      equal_bytes.py; the C++ edition in another database of the cluster,
#      where CREATE EXTENSION loads the library into that database's sessions);
#   5. cleanup through pg_cron, run by the owner's job;
#   6. from the trusted edition to the C++ edition on the same data and back;
#   7. the HTTP conformance suite against the Python orders service on it.
# Port: PGPORT + 33 of the cluster of scripts/test.sh (IDEM_TRUSTED_PORT overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d /tmp/idem-trusted.XXXXXX)
service_pid=""
trap 'if [[ -n $service_pid ]]; then kill "$service_pid" 2>/dev/null || true; fi
      scripts/pgcluster.sh stop "$dir/pg" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
PGCLUSTER_PRELOAD=pg_cron PGCLUSTER_CONF="cron.use_background_workers = on" \
  scripts/pgcluster.sh start "$dir/pg" "${IDEM_TRUSTED_PORT:-$((${PGPORT:-54329} + 33))}"
# shellcheck disable=SC1091
source "$dir/pg/env"
PGBIN=$(pg_config --bindir)
PGXS_DIR=$(dirname "$(pg_config --pgxs)")/..
version=$(cat VERSION)
make -s trusted >/dev/null
script=build/trusted/idempotency--$version.sql
tle=build/trusted/idempotency--$version.pgtle.sql

passes=0
failures=0
check() {
  local what=$1
  shift
  if "$@"; then
    echo "ok - $what"
    passes=$((passes + 1))
  else
    echo "not ok - $what"
    failures=$((failures + 1))
  fi
}
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }

[[ $(q -c "SHOW shared_preload_libraries") == pg_cron ]] || {
  echo "FAIL: library preloaded"
  exit 1
}
q -c "CREATE ROLE idem_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" \
  -c "CREATE DATABASE idem_trusted OWNER idem_owner"

# 1. The owner installs it.
check "the owner is not a superuser" \
  test "$(q -U idem_owner -d idem_trusted \
          -c "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")" = f
check "psql -f as the owner installs the edition" \
  q -U idem_owner -d idem_trusted -f "$script"
check "no function of the edition is in C, no extension row" test "$(q -d idem_trusted -c "
  SELECT count(*) FILTER (WHERE l.lanname NOT IN ('sql', 'plpgsql'))
         + (SELECT count(*) FROM pg_extension WHERE extname = 'idempotency')
    FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
   WHERE p.pronamespace = 'idempotency'::regnamespace")" = 0
check "every function has a COMMENT and pins its search_path (cleanup qualifies instead)" \
  test "$(q -d idem_trusted -c "
  SELECT count(*) FROM pg_proc AS p
   WHERE p.pronamespace = 'idempotency'::regnamespace
     AND (obj_description(p.oid, 'pg_proc') IS NULL
          OR (p.proname <> 'cleanup' AND NOT coalesce(p.proconfig::text LIKE
              '%search_path=pg_catalog, pg_temp%', false)))")" = 0
check "the owner's edition answers" test "$(q -U idem_owner -d idem_trusted -c "
  SELECT idempotency.edition(), idempotency.jcs('{ \"b\": 1.0, \"a\": [1e21, \"\\u00e9\"] }')")" \
  = 'trusted '"$version"'|{"a":[1e+21,"é"],"b":1}'

# 2. The pg_tle form: its body, between the dollar quotes, through a stand-in
#    for pgtle.install_extension that runs it (pg_tle is not in Debian).
q -c "CREATE DATABASE idem_tle OWNER idem_owner"
q -U idem_owner -d idem_tle -c "
  CREATE SCHEMA pgtle;
  CREATE FUNCTION pgtle.install_extension(name text, version text, description text, ext text,
                                          requires text[] DEFAULT NULL) RETURNS boolean
  LANGUAGE plpgsql AS \$\$ BEGIN EXECUTE ext; RETURN true; END \$\$;"
check "the pg_tle form parses and its body installs as the owner" \
  q -U idem_owner -d idem_tle -o /dev/null -f "$tle"
check "the pg_tle body is the psql -f body" test "$(q -d idem_tle -c "
  SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace")" \
  = "$(q -d idem_trusted \
        -c "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace")"

# 3. pg_regress and the isolation specs that apply.
# Every file of sql/ runs but those that test what the trusted edition does not
# have by design:
#   counters          the shared-memory counters of a preloaded library (the
#                     trusted edition's are off, as the C++ edition's without
#                     preload: counters_across_backends below, with its hint);
#   distributed       Citus: idempotency.distributed and distribute() (0A000 in
#                     the trusted edition, tests/trusted/calls.sql);
#   upgrade           the C++ edition's update scripts from 0.1.0 and its
#                     extension members (no scripts: a release moves the data,
#                     step 6 below);
#   upgrade_library   the library serving the 0.7.0 schema and refusing a newer
#                     one (no library: the schema is the code).
# Parts of three run without what cannot apply (tests/trusted/<file>.sed):
# guarantees.sql without section 8 (principals bound per session; the binding's
# refusal is checked below), fences.sql without the update from 0.7.0, jcs.sql
# with a smaller "big" document (64 MiB takes the trusted edition minutes).
# Isolation: every spec of tests/isolation but schema_newer (the library
# refusing a schema newer than it knows: no library), and one of its own.
regress=(protocol lease batch expired headers cleanup cleanup_cancel cleanup_order ttl_limits
         findings_080 http_answer fingerprint security_search_path guarantees fences jcs
         jcs_encoding)
isolation=(batch_opposite_orders cleanup_races_takeover cleanup_twice_at_once
           counters_across_backends duplicate_waits_then_replays expired_retry_races_cleanup
           key_table_invalidation lease_and_begin
           principals_are_separate repeatable_read_conflict repeatable_read_expired_winner
           rollback_lets_duplicate_start save_final_races_release wait_timeout_keeps_transaction
           cleanup_spares_replaced_tombstone trusted_cleanup_deletes_begun_row)
rm -rf output_trusted
mkdir -p output_trusted/regress output_trusted/isolation
# The database has pg_regress's usual name: fences.sql and jcs_encoding.sql
# come back to it with \c contrib_regression.
regress_db=contrib_regression
q -c "CREATE DATABASE $regress_db OWNER idem_owner"
q -U idem_owner -d "$regress_db" -f "$script"
# The files of sql/, with the check of tests/trusted/refused_at_use.awk after each
# SET, the trusted edition's script instead of CREATE EXTENSION
# (tests/trusted/create_extension.sed), and each file's own tests/trusted/<file>.sed.
mkdir -p "$dir/regress/sql"
ln -s "$PWD/tests/trusted/expected" "$dir/regress/expected"
for t in "${regress[@]}"; do
  own=()
  [[ -f tests/trusted/$t.sed ]] && own=(-f "tests/trusted/$t.sed")
  sed -f tests/trusted/create_extension.sed "${own[@]}" "sql/$t.sql" |
    awk -f tests/trusted/refused_at_use.awk >"$dir/regress/sql/$t.sql"
done
check "pg_regress: ${#regress[@]} files" \
  "$PGXS_DIR/test/regress/pg_regress" --use-existing --dbname="$regress_db" \
  --inputdir="$dir/regress" \
  --outputdir=output_trusted/regress --bindir="$PGBIN" "${regress[@]}"
q -c "CREATE DATABASE idem_isolation OWNER idem_owner"
q -U idem_owner -d idem_isolation -f "$script"
check "isolation: ${#isolation[@]} specs" \
  "$PGXS_DIR/test/isolation/pg_isolation_regress" --use-existing --dbname=idem_isolation \
  --inputdir=tests/trusted/isolation --outputdir=output_trusted/isolation --bindir="$PGBIN" \
  "${isolation[@]}"
cat output_trusted/*/regression.diffs 2>/dev/null | head -100 || true

# A principal binding the trusted edition cannot enforce refuses (0A000), also
# after the role SETs the placeholder off in its session.
q -d "$regress_db" -c "CREATE ROLE idem_tenant LOGIN" \
  -c "GRANT USAGE ON SCHEMA idempotency TO idem_tenant"
q -U idem_owner -d "$regress_db" \
  -c "GRANT EXECUTE ON FUNCTION idempotency.claim(text, text, interval) TO idem_tenant"
q -d "$regress_db" \
  -c "ALTER DATABASE $regress_db SET idempotency.principal_binding = 'current_user'"
check "a database-wide principal binding refuses every call (0A000), SET off or not" \
  test "$(psql -X -q -At -U idem_tenant -d "$regress_db" -c '\set VERBOSITY sqlstate' \
          -c 'SET idempotency.principal_binding = off' \
          -c "SELECT idempotency.claim('other', 'k')" 2>&1)" \
  = "ERROR:  0A000"
q -d "$regress_db" -c "ALTER DATABASE $regress_db RESET idempotency.principal_binding"

# 4. The same bytes as the C++ edition.
q -c "CREATE DATABASE idem_cpp" && q -d idem_cpp -c "CREATE EXTENSION idempotency"
check "jcs and fingerprint: the C++ edition's bytes" /usr/bin/python3 tests/trusted/equal_bytes.py \
  --count "${FINGERPRINT_DOCUMENTS:-1000}" \
  --cpp "host=$PGHOST port=$PGPORT dbname=idem_cpp user=postgres" \
  --trusted "host=$PGHOST port=$PGPORT dbname=idem_trusted user=idem_owner"

# The same answers, call by call (tests/trusted/calls.sql), in fresh databases.
q -c "CREATE DATABASE idem_calls_cpp" && q -d idem_calls_cpp -c "CREATE EXTENSION idempotency"
q -c "CREATE DATABASE idem_calls OWNER idem_owner"
q -U idem_owner -d idem_calls -f "$script"
answer() { { psql -X -q -At -d "$1" -c '\set VERBOSITY sqlstate' -c "$2" 2>&1 || true; } | tr '\n' ' '; }
differ=0
entries=0
while IFS= read -r -d $'\x1e' entry; do
  [[ -z ${entry//[$'\n ']/} ]] && continue
  entries=$((entries + 1))
  cpp=$(answer idem_calls_cpp "$entry")
  trusted=$(answer idem_calls "$entry")
  if [[ $cpp != "$trusted" ]]; then
    echo "# differs: $entry"$'\n'"#   C++: $cpp"$'\n'"#   trusted: $trusted"
    differ=$((differ + 1))
  fi
done < <(grep -v '^--' tests/trusted/calls.sql | awk 'BEGIN {RS = ""; ORS = "\x1e"} {print}')
check "the same answers and SQLSTATEs for $entries calls (tests/trusted/calls.sql)" test "$differ" = 0

# 5. Cleanup through pg_cron (pg_cron lives in cron.database_name, idem_cron): the
#    owner schedules it, the job (every minute) runs as the owner.
check "schedule_cleanup without pg_cron: 55000" \
  test "$(psql -X -q -At -U idem_owner -d idem_trusted \
  -c '\set VERBOSITY sqlstate' -c 'SELECT idempotency.schedule_cleanup()' 2>&1)" = "ERROR:  55000"
q -d idem_cron -c "ALTER DATABASE idem_cron OWNER TO idem_owner" -c "CREATE EXTENSION pg_cron" \
  -c "GRANT USAGE ON SCHEMA cron TO idem_owner"
q -U idem_owner -d idem_cron -f "$script"
q -U idem_owner -d idem_cron -c "
  INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status,
                                created_at, expires_at, fence)
  SELECT 'p', 'expired-' || i, 'a', sha256('x'), 'completed', 200, now() - interval '2 h',
         now() - interval '1 h', i FROM generate_series(1, 50) AS i;
  INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status,
                                created_at, expires_at, fence)
  SELECT 'p', 'tomb-' || i, 'refund', sha256('x'), 'completed', 200, now() - interval '2 h',
         now() - interval '1 h', i FROM generate_series(1, 5) AS i;
  SELECT idempotency.set_expiry_policy('refund', 'refuse');
  SELECT idempotency.schedule_cleanup();
  SELECT idempotency.schedule_cleanup('* * * * *');" >/dev/null
check "one job idempotency:cleanup, the owner's" test "$(q -d idem_cron -c "
  SELECT count(*) || ' ' || min(username) FROM cron.job WHERE jobname = 'idempotency:cleanup'")" \
  = "1 idem_owner"
echo "waiting for the job (at most 80 s)..."
for _ in $(seq 80); do
  left=$(q -d idem_cron -c "SELECT count(*) FROM idempotency.keys WHERE key LIKE 'expired-%'")
  [[ $left == 0 ]] && break
  sleep 1
done
check "the owner's pg_cron job deleted the expired keys" \
  test "$(q -d idem_cron -c "SELECT count(*) FROM idempotency.keys WHERE key LIKE 'expired-%'")" = 0
check "and kept the refusing action's as tombstones" test "$(q -d idem_cron -c "
  SELECT count(*) FROM idempotency.keys WHERE key LIKE 'tomb-%' AND state = 'expired'")" = 5
check "unschedule_cleanup removes the job" \
  test "$(q -U idem_owner -d idem_cron -c "SELECT idempotency.unschedule_cleanup()")" = t

# 6. From one edition to the other on the same data (docs/installation.md).
q -U idem_owner -d idem_trusted -c "
  BEGIN;
  SELECT outcome FROM idempotency.begin('u', 'move-1', 'a',
                                        idempotency.fingerprint('POST', '/m', '\\x7b7d'));
  SELECT idempotency.complete('u', 'move-1', 201, convert_to('moved', 'UTF8'));
  COMMIT;
  SELECT idempotency.set_expiry_policy('pay', 'refuse', '3 days');" >/dev/null
replay() {
  q -d idem_trusted -c "SELECT outcome || ' ' || convert_from(response_body, 'UTF8') || ' '
                          || (SELECT count(*) FROM idempotency.expiry_policies)
                          FROM idempotency.begin('u', 'move-1', 'a',
                               idempotency.fingerprint('POST', '/m', '\\x7b7d'))"
}
pg_dump -d idem_trusted --data-only --schema=idempotency -f "$dir/keys.sql"
q -d idem_trusted -c "DROP SCHEMA idempotency CASCADE" -c "CREATE EXTENSION idempotency"
q -d idem_trusted -f "$dir/keys.sql" >/dev/null
check "trusted -> C++ edition: the stored response replays" test "$(replay)" = "replay moved 1"
pg_dump -d idem_trusted --data-only --schema=idempotency -f "$dir/keys2.sql"
q -d idem_trusted -c "DROP EXTENSION idempotency" -c "DROP SCHEMA idempotency" \
  -c "ALTER DATABASE idem_trusted OWNER TO idem_owner"
q -U idem_owner -d idem_trusted -f "$script"
q -U idem_owner -d idem_trusted -f "$dir/keys2.sql" >/dev/null
check "C++ -> trusted edition: the stored response replays" test "$(replay)" = "replay moved 1"

# 6b. A wait that runs out just as the key lock is granted: the trusted edition
#     takes that lock timeout inside its own exception block (in_progress, the
#     transaction goes on), as the C++ edition does since 0.9.0.
q -c "CREATE DATABASE idem_race OWNER idem_owner"
q -U idem_owner -d idem_race -f "$script"
check "a wait that runs out as the key is granted is a timeout (lock_timeout_race.sh)" \
  bash -c 'IDEM_RACE_DB=idem_race bash tests/integration/lock_timeout_race.sh >"$0/race.log" 2>&1 ||
           { cat "$0/race.log"; exit 1; }' "$dir"

# 7. The conformance suite, one example service on a database with the trusted
#    edition. The suite reads idempotency.wait_timeout, which has no value until
#    someone sets it without the library: its own connection sets the default.
q -c "CREATE DATABASE idem_conformance OWNER idem_owner"
q -U idem_owner -d idem_conformance -f "$script"
# Not a port derived from PGPORT: the example service binds without
# SO_REUSEADDR, so a run right after another would meet its TIME_WAIT sockets.
# A random one between the test command's ports (20000-26099) and the chroots'
# (28000 and up), below the kernel's ephemeral range (32768-60999), where an
# outgoing connection could hold it.
service_port=${IDEM_TRUSTED_SERVICE_PORT:-$((26100 + RANDOM % 1800))}
/usr/bin/python3 examples/python-orders/app.py --port "$service_port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=idem_conformance user=postgres" 2>"$dir/service.log" &
service_pid=$!
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$service_port/health" >/dev/null && break
  sleep 0.1
done
curl -fs "http://127.0.0.1:$service_port/health" >/dev/null || cat "$dir/service.log"
check "conformance: the Python orders service on the trusted edition" \
  /usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$service_port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=idem_conformance user=postgres
         options='-c idempotency.wait_timeout=5s'"

echo "$passes passed, $failures failed"
((failures == 0))
