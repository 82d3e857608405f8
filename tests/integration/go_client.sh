#!/usr/bin/env bash
# The Go package (client/go) against a fresh database of the throwaway
# cluster: gofmt and go vet clean (package and examples/go-orders), then
# go test (transactional and lease protocols, round trips, middleware, the
# table checked against client/protocol.json), and the first example of
# docs/go.md built and run. GOPATH mode on Debian's pgx v4.
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
# The files gofmt would change go to stderr through the shell (tee /dev/stderr
# reopens the path: when stderr is a log file, that truncated the whole log).
gofmt_clean() {
  local out
  out=$(gofmt -l "$@")
  [[ -z $out ]] || { echo "$out" >&2; return 1; }
}
check "gofmt: client/go and examples/go-orders are formatted" gofmt_clean client/go examples/go-orders
check "go vet: client/go and examples/go-orders" go vet "$go_module" "${go_module%/client/go}/examples/go-orders"
check "go test: client/go against the cluster" \
  env IDEM_GO_TEST_DSN="postgres://${PGUSER:-postgres}@127.0.0.1:$PGPORT/$service_db" \
  go test -count=1 -v "$go_module"
# The first example of docs/go.md, as written there: a whole program that
# must build and run (a call and its retry: 201, then the replay).
doc_example=$work/gopath/src/docexample
mkdir -p "$doc_example"
awk '/^```go$/ { n++; if (n == 1) { inside = 1; next } } /^```$/ { inside = 0 } inside' docs/go.md \
  >"$doc_example/main.go"
doc_example_runs() {
  DATABASE_URL="postgres://${PGUSER:-postgres}@127.0.0.1:$PGPORT/$service_db" go run docexample >"$work/doc.out" &&
    cat "$work/doc.out" &&
    [[ $(sed -n 1p "$work/doc.out") == '201 {"id":1} replayed: false' ]] &&
    [[ $(sed -n 2p "$work/doc.out") == '201 {"id":1} replayed: true' ]]
}
check "docs/go.md: the first example is gofmt-clean" test -z "$(gofmt -l "$doc_example/main.go")"
check "docs/go.md: the first example builds and runs (a call, then its replay)" doc_example_runs
report
