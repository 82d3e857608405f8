# Sourced by the Go tests and benchmarks (not run): a GOPATH in which this
# repository is github.com/pg-idempotency/pg-idempotency, next to Debian's Go
# sources (/usr/share/gocode: golang-github-jackc-pgx-v4-dev), so the package
# and the example build offline in GOPATH mode; nothing is downloaded.
#
#   source client/go/gopath.bash DIR    DIR: a scratch folder (GOPATH, build cache)
#
# Sets GOPATH, GO111MODULE=off, GOFLAGS, GOCACHE (unless set), GOTMPDIR and go_module, the
# package's import path. Fails when go or pgx v4 is missing.
go_scratch=${1:?usage: source client/go/gopath.bash DIR}
go_module=github.com/pg-idempotency/pg-idempotency/client/go
if ! command -v go >/dev/null || [[ ! -d /usr/share/gocode/src/github.com/jackc/pgx/v4 ]]; then
  echo "needs go and pgx v4 (Debian golang-go, golang-github-jackc-pgx-v4-dev; scripts/install-deps.sh)" >&2
  return 1
fi
mkdir -p "$go_scratch/gopath/src/github.com/pg-idempotency" "$go_scratch/cache"
ln -sfn "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)" \
  "$go_scratch/gopath/src/github.com/pg-idempotency/pg-idempotency"
export GOPATH="$go_scratch/gopath:/usr/share/gocode" GO111MODULE=off GOFLAGS= \
  GOCACHE="${GOCACHE:-$go_scratch/cache}" GOTMPDIR="$go_scratch"
