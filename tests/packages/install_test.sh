#!/usr/bin/env bash
# Runs inside a clean chroot of a Debian suite (nothing but debootstrap's
# minbase): installs the built packages the way a user does, with apt
# resolving their dependencies, then checks they work.
#
#   install_test.sh PGVERSION DEBS_DIR CONSUMER_DIR
#
# 1. apt-get install ./postgresql-PGVERSION-idempotency_*.deb ./libidempotency-client-dev_*.deb
# 2. a cluster made with postgresql-common (pg_createcluster), CREATE EXTENSION
#    idempotency, one request through begin/complete and its replay
# 3. g++, make, cmake, pkgconf (a consumer's own tools), then tests/install_consumer
#    built against the installed client with find_package and with pkg-config,
#    each running one request end to end against the cluster.
# Prints "ok - ..." per step; exits non-zero at the first failure.
set -euo pipefail
pg=$1 debs=$2 consumer=$3
export DEBIAN_FRONTEND=noninteractive
step() { echo "ok - package: $*"; }

apt-get update -q >/dev/null
apt-get install -y -q "$debs"/postgresql-"$pg"-idempotency_*.deb "$debs"/libidempotency-client-dev_*.deb >/tmp/apt.log 2>&1 ||
  { tail -30 /tmp/apt.log; exit 1; }
step "apt-get install of postgresql-$pg-idempotency and libidempotency-client-dev resolved their dependencies"

port=${IDEM_TEST_PORT:-5432}
pg_createcluster "$pg" pkgtest -p "$port" >/dev/null -- --locale=C.UTF-8 -E UTF8
pg_ctlcluster "$pg" pkgtest start
trap 'pg_ctlcluster "$pg" pkgtest stop -m immediate >/dev/null 2>&1 || true' EXIT
q() { runuser -u postgres -- psql -X -q -At -v ON_ERROR_STOP=1 -p "$port" -d pkgtest "$@"; }
runuser -u postgres -- createdb -p "$port" pkgtest
q -c "CREATE EXTENSION idempotency"
[[ $(q -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'") == "$(cat /src/VERSION)" ]]
step "CREATE EXTENSION idempotency (PostgreSQL $pg)"
first=$(q <<'SQL'
BEGIN;
SELECT outcome FROM idempotency.begin('pkg', 'k1', 'POST /things', idempotency.fingerprint('POST', '/things'));
SELECT idempotency.complete('pkg', 'k1', status => 201, body => convert_to('made', 'UTF8'));
COMMIT;
SQL
)
again=$(q -c "BEGIN" -c "SELECT outcome || ' ' || response_status || ' ' || convert_from(response_body, 'UTF8')
  FROM idempotency.begin('pkg', 'k1', 'POST /things', idempotency.fingerprint('POST', '/things'))" -c "COMMIT")
[[ $first == $'started\nt' && $again == 'replay 201 made' ]] || { echo "first: $first / again: $again"; exit 1; }
step "one request through begin/complete, and its replay"

apt-get install -y -q --no-install-recommends g++ make cmake pkgconf >/tmp/apt2.log 2>&1 || { tail -30 /tmp/apt2.log; exit 1; }
dsn="host=/var/run/postgresql port=$port dbname=pkgtest user=postgres"
work=$(mktemp -d)
chmod 755 "$work"
cmake -S "$consumer" -B "$work/cmake" >/dev/null
cmake --build "$work/cmake" >/dev/null
runuser -u postgres -- "$work/cmake/consumer" "$dsn" cmake
step "consumer built with find_package(idempotency_client) ran a request"
# shellcheck disable=SC2046
g++ -o "$work/consumer-pc" "$consumer/consumer.cpp" $(pkg-config --cflags --libs idempotency_client)
runuser -u postgres -- "$work/consumer-pc" "$dsn" pkgconfig
step "consumer built with pkg-config ran a request"
