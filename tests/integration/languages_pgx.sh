#!/usr/bin/env bash
# The Go (pgx) forms of docs/languages.md against a fresh database of the
# throwaway cluster (tests/languages/pgx_forms.go), built in GOPATH mode
# against Debian's golang-github-jackc-pgx-v4-dev: nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/../.."
gopath=/usr/share/gocode
if ! command -v go >/dev/null || [[ ! -d $gopath/src/github.com/jackc/pgx/v4 ]]; then
  echo "not ok - needs go and pgx v4 (Debian golang-go, golang-github-jackc-pgx-v4-dev; scripts/install-deps.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_languages_pgx
GOPATH=$gopath GO111MODULE=off GOFLAGS= GOCACHE="$work/go-cache" GOTMPDIR="$work" \
  go run tests/languages/pgx_forms.go "postgres://${PGUSER:-postgres}@127.0.0.1:$PGPORT/$service_db"
