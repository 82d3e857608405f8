#!/usr/bin/env bash
# The HTTP conformance suite (tests/conformance) against the Go example,
# examples/go-orders (net/http middleware of client/go on pgx v5), on a fresh
# database of the throwaway cluster. Built as a module (modules from the Go
# module proxy; go.sum committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
if ! command -v go >/dev/null; then
  echo "not ok - go toolchain (Go 1.26 or later; scripts/install-deps.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
(cd examples/go-orders && go build -o "$work/go-orders" .)
fresh_database idem_conformance_go
port=$((PGPORT + 18))
start_service "$port" "$work/go-orders"
wait_for_tables orders api_keys
/usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
