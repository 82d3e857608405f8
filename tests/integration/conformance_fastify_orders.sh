#!/usr/bin/env bash
# The HTTP conformance suite (tests/conformance) against the Node example,
# examples/fastify-orders (Fastify plugin of client/node), on a fresh database
# of the throwaway cluster. Needs client/node built (npm ci + tsc, which
# scripts/test.sh does in the Node suite before the integration tests); the
# example is installed from its own lock file (npm ci), as a user would.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ ! -f client/node/dist/index.js || ! -d client/node/node_modules/pg ]]; then
  echo "not ok - client/node is not built (cd client/node && npm ci)"
  echo "0 passed, 1 failed"
  exit 1
fi
if ! (cd examples/fastify-orders && npm ci --no-audit --no-fund --loglevel=error); then
  echo "not ok - npm ci in examples/fastify-orders"
  echo "0 passed, 1 failed"
  exit 1
fi
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_conformance_fastify
port=$((PGPORT + 14))
start_service "$port" examples/fastify-orders/app.js
wait_for_tables orders api_keys
/usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
