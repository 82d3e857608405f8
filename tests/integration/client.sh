#!/usr/bin/env bash
# Client library integration tests: against the cluster directly, then through
# pgbouncer in transaction pooling mode. Needs the C++ build in build-test/
# (scripts/test.sh makes it) or BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-test}
db=idem_client
work=$(mktemp -d)
chmod 755 "$work"
bouncer_pid=""
cleanup() {
  [[ -n $bouncer_pid ]] && kill "$bouncer_pid" 2>/dev/null || true
  rm -rf "$work"
  psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT

psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
psql -X -q -v ON_ERROR_STOP=1 -d "$db" -c "CREATE EXTENSION idempotency"

echo "--- client tests against PostgreSQL"
PGDATABASE=$db "$build/client_integration_tests" --gtest_brief=1

echo "--- client tests through pgbouncer (pool_mode = transaction)"
bport=$((PGPORT + 1))
cat >"$work/pgbouncer.ini" <<INI
[databases]
$db = host=127.0.0.1 port=$PGPORT dbname=$db user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $work/users.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 20
max_client_conn = 300
ignore_startup_parameters = extra_float_digits
logfile = $work/pgbouncer.log
INI
echo '"postgres" ""' >"$work/users.txt"
chown -R postgres "$work" 2>/dev/null || true
if [[ $(id -u) -eq 0 ]]; then
  runuser -u postgres -- pgbouncer -q "$work/pgbouncer.ini" >>"$work/pgbouncer.out" 2>&1 &
else
  pgbouncer -q "$work/pgbouncer.ini" >>"$work/pgbouncer.out" 2>&1 &
fi
bouncer_pid=$!
for _ in $(seq 50); do
  psql -X -q -h 127.0.0.1 -p "$bport" -d "$db" -c "SELECT 1" >/dev/null 2>&1 && break
  sleep 0.1
done
# The tests below are only worth their name if pgbouncer really pools by
# transaction: ask its admin console, for the setting and for our pool.
admin() { psql -X -A -F '|' -h 127.0.0.1 -p "$bport" -U postgres -d pgbouncer -c "$1"; }
column() { # column NAME KEY_COLUMN KEY: the value of NAME in the row whose KEY_COLUMN is KEY
  awk -F'|' -v name="$1" -v keycol="$2" -v key="$3" \
    'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
     col[keycol] && $col[keycol] == key { print $col[name] }'
}
config_mode=$(admin "SHOW CONFIG" | column value key pool_mode)
pool_mode=$(admin "SHOW POOLS" | column pool_mode database "$db")
echo "pgbouncer: pool_mode = '$config_mode', pool $db: '$pool_mode'"
if [[ $config_mode != transaction || $pool_mode != transaction ]]; then
  echo "FAIL: pgbouncer does not run with pool_mode = transaction" >&2
  exit 1
fi
IDEM_TEST_PGBOUNCER=1 IDEM_TEST_DSN="host=127.0.0.1 port=$bport dbname=$db user=postgres" \
  "$build/client_integration_tests" --gtest_brief=1
