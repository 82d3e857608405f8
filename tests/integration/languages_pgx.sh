#!/usr/bin/env bash
# The Go (pgx v5) forms of docs/languages.md against a fresh database of the
# throwaway cluster (tests/languages/pgx_forms.go, in the module of
# tests/languages/go.mod; modules from the Go module proxy, go.sum committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v go >/dev/null; then
  echo "not ok - needs go (Go 1.26 or later; scripts/install-deps.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_languages_pgx
cd tests/languages
go run pgx_forms.go "postgres://${PGUSER:-postgres}@127.0.0.1:$PGPORT/$service_db"
