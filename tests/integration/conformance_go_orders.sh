#!/usr/bin/env bash
# The HTTP conformance suite (tests/conformance) against the Go example,
# examples/go-orders (net/http middleware of client/go), on a fresh database
# of the throwaway cluster. Built in GOPATH mode on Debian's pgx v4 (host only).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
# shellcheck source=../../client/go/gopath.bash
if ! source client/go/gopath.bash "$work"; then
  echo "not ok - go toolchain"
  echo "0 passed, 1 failed"
  exit 1
fi
go build -o "$work/go-orders" "${go_module%/client/go}/examples/go-orders"
fresh_database idem_conformance_go
port=$((PGPORT + 18))
start_service "$port" "$work/go-orders"
wait_for_tables orders api_keys
/usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
