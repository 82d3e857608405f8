#!/usr/bin/env bash
# Fingerprints agree across languages: C++ (jcs_tool), Python (the client's
# parameters) and SQL on the RFC 8785 vectors and 1,000 generated documents.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-test}
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_fingerprints
/usr/bin/python3 tests/fingerprints/agree.py --jcs-tool "$build/jcs_tool" --count "${FINGERPRINT_DOCUMENTS:-1000}" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
