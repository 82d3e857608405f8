#!/usr/bin/env bash
# The HTTP conformance suite (tests/conformance) against the C++ example,
# examples/orders-service, on a fresh database of the throwaway cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-test}
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_conformance_cpp
port=$((PGPORT + 5))
start_service "$port" "$build/orders-service"
wait_for_tables orders api_keys
/usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
