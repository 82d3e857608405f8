#!/usr/bin/env bash
# The Go package (client/go) against a fresh database of the throwaway
# cluster: gofmt and go vet clean (package and examples/go-orders), then
# go test (transactional and lease protocols, round trips, middleware, the
# table checked against client/protocol.json). GOPATH mode on Debian's pgx v4.
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
fresh_database idem_go_client
check "gofmt: client/go and examples/go-orders are formatted" \
  test -z "$(gofmt -l client/go examples/go-orders | tee /dev/stderr)"
check "go vet: client/go and examples/go-orders" go vet "$go_module" "${go_module%/client/go}/examples/go-orders"
check "go test: client/go against the cluster" \
  env IDEM_GO_TEST_DSN="postgres://${PGUSER:-postgres}@127.0.0.1:$PGPORT/$service_db" \
  go test -count=1 -v "$go_module"
report
