#!/usr/bin/env bash
# The Go package (client/go, a module on pgx v5) and the Go example
# (examples/go-orders: River, sqlc-shaped queries) against a fresh database of
# the throwaway cluster: gofmt clean, go vet ./... and go test -race ./... in
# both modules (the package's tests: transactional and lease protocols, round
# trips, middleware, per-route options; the example's: River jobs inserted in
# the request's transaction, the sqlc-shaped handler), and the first example of
# docs/go.md built and run as a module of its own. client/go/protocol_gen.go
# must be what tools/protocol_gen.py makes of client/protocol.json now, and no
# other file of the package may spell a problem type or protocol header. Modules
# come from the Go module proxy (GOPROXY; a cold module cache is filled by go
# mod download).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
if ! command -v go >/dev/null; then
  echo "not ok - go toolchain (Go 1.26 or later; scripts/install-deps.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
repo=$(pwd)
fresh_database idem_go_client
dsn="postgres://${PGUSER:-postgres}@127.0.0.1:$PGPORT/$service_db"
check "go mod download: client/go and examples/go-orders (from the module proxy, go.sum checked)" \
  bash -c 'cd client/go && go mod download && go mod verify >/dev/null &&
    cd ../../examples/go-orders && go mod download && go mod verify >/dev/null'
# The files gofmt would change go to stderr through the shell (tee /dev/stderr
# reopens the path: when stderr is a log file, that truncated the whole log).
gofmt_clean() {
  local out
  out=$(gofmt -l "$@")
  [[ -z $out ]] || { echo "$out" >&2; return 1; }
}
check "gofmt: client/go and examples/go-orders are formatted" gofmt_clean client/go examples/go-orders
# client/go/protocol_gen.go is generated from client/protocol.json: a fresh run
# must give the committed file byte for byte (a stale file fails here).
protocol_gen_fresh() {
  /usr/bin/python3 tools/protocol_gen.py go >"$work/protocol_gen.go" &&
    diff -u client/go/protocol_gen.go "$work/protocol_gen.go"
}
check "tools/protocol_gen.py go: client/go/protocol_gen.go is not stale" protocol_gen_fresh
# No problem type, status table or header list written by hand in the Go package
# (outside the generated file and the tests): the protocol's names are generated.
no_hand_table() {
  ! grep -nE '"(/problems/|idempotency-key-|request-in-progress|one-time-secret|response-not-kept|request-body-invalid|database-unavailable|Idempotent-Replay|Idempotency-Expires|Idempotency-Key"|application/problem\+json)' \
    $(ls client/go/*.go | grep -v -e _test.go -e protocol_gen.go)
}
check "client/go: no problem type or protocol header written by hand" no_hand_table
check "go vet ./...: client/go" bash -c 'cd client/go && go vet ./...'
check "go vet ./...: examples/go-orders" bash -c 'cd examples/go-orders && go vet ./...'
check "go test -race ./...: client/go against the cluster" \
  env IDEM_GO_TEST_DSN="$dsn" bash -c 'cd client/go && go test -race -count=1 ./...'
check "go test -race ./...: examples/go-orders against the cluster (River, sqlc shape)" \
  env IDEM_GO_TEST_DSN="$dsn" bash -c 'cd examples/go-orders && go test -race -count=1 ./...'
check "no pgx v4 and no GOPATH mode left in the Go modules" \
  bash -c '! grep -rn "jackc/pgx/v4\|jackc/pgconn\|GO111MODULE" client/go examples/go-orders'
# The first example of docs/go.md, as written there: a whole program in a module
# of its own (go.mod replaces the package by this checkout) that must build and
# run (a call and its retry: 201, then the replay).
doc_example=$work/docexample
mkdir -p "$doc_example"
awk '/^```go$/ { n++; if (n == 1) { inside = 1; next } } /^```$/ { inside = 0 } inside' docs/go.md \
  >"$doc_example/main.go"
doc_example_runs() {
  (cd "$doc_example" &&
    go mod init docexample >/dev/null 2>&1 &&
    go mod edit -require=github.com/pg-idempotency/pg-idempotency/client/go@v0.0.0 \
      -replace=github.com/pg-idempotency/pg-idempotency/client/go="$repo/client/go" &&
    go mod tidy >/dev/null 2>&1 &&
    DATABASE_URL="$dsn" go run . >"$work/doc.out") &&
    cat "$work/doc.out" &&
    [[ $(sed -n 1p "$work/doc.out") == '201 {"id":1} replayed: false' ]] &&
    [[ $(sed -n 2p "$work/doc.out") == '201 {"id":1} replayed: true' ]]
}
check "docs/go.md: the first example is gofmt-clean" test -z "$(gofmt -l "$doc_example/main.go")"
check "docs/go.md: the first example builds and runs (a call, then its replay)" doc_example_runs
report
