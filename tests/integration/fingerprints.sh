#!/usr/bin/env bash
# Fingerprints agree across languages: C++ (jcs_tool), Python and Node (the clients'
# parameters) and SQL on the RFC 8785 vectors and 1,000 generated documents.
# Node needs client/node built (scripts/test.sh's Node suite); the matrix
# chroots have no node, so IDEM_TEST_SCOPE=matrix leaves Node out.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-test}
node=()
[[ ${IDEM_TEST_SCOPE:-full} == matrix ]] && node=(--node "")
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_fingerprints
/usr/bin/python3 tests/fingerprints/agree.py --jcs-tool "$build/jcs_tool" --count "${FINGERPRINT_DOCUMENTS:-1000}" \
  "${node[@]}" --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
