#!/usr/bin/env bash
# The HTTP conformance suite (tests/conformance) against the Python example,
# examples/python-orders (WSGI middleware of client/python), on a fresh
# database of the throwaway cluster. PYTHONPATH may point at an installed copy
# of the package (scripts/test.sh installs it with pip); otherwise the example
# uses the one in client/python/src.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_conformance_python
port=$((PGPORT + 6))
start_service "$port" examples/python-orders/app.py
wait_for_tables orders api_keys
/usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
