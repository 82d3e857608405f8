#!/usr/bin/env bash
# client/rust/tools/msrv.sh: builds the crate with the oldest Rust it says it supports.
#
# The toolchain named by Cargo.toml's rust-version builds the crate without features and
# with `axum`, and examples/rust-orders (its own rust-version must be the same); the
# feature `sqlx` (--all-features) is built with the highest rust-version among the locked
# crates it pulls in (sqlx's). A toolchain that is missing is installed with rustup
# (--profile minimal: no clippy, no rustfmt). For each: `cargo build --locked
# --all-targets`, then the doc tests and the tests that need no database (unit, http.rs,
# docs_example.rs); with a cluster's env sourced (PGHOST, PGPORT, PGUSER, PGDATABASE of
# a database with the extension) the unit tests and every test file against it instead,
# tls.rs included: as tests/integration/rust_client.sh does, a throwaway cluster with
# ssl = on on PGPORT+14 and certificates made with openssl
# (tests/integration/lib/tls_cluster.bash; the extension installed), unless
# IDEM_RUST_TLS_PORT, IDEM_RUST_TLS_CA and IDEM_RUST_TLS_OTHER_CA name one already. Each
# check ends with the number of tests that passed.
#
# Run by hand: not in CI and not in scripts/test.sh, because it downloads toolchains from
# rustup's own server, which CI's machines may not reach. Builds into
# ~/.cache/idempotency/cargo-target-msrv (CARGO_TARGET_DIR overrides).
#
#     scripts/pgcluster.sh start /tmp/pg && source /tmp/pg/env &&
#       psql -c "CREATE EXTENSION idempotency" && client/rust/tools/msrv.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/idempotency/cargo-target-msrv}
# The release a rust-version names: "1.88" is checked with 1.88.0, the oldest.
release() { if [[ $1 == *.*.* ]]; then echo "$1"; else echo "$1.0"; fi; }
rust_version() { release "$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' "$1")"; }
msrv=$(rust_version Cargo.toml)
if [[ $(rust_version ../../examples/rust-orders/Cargo.toml) != "$msrv" ]]; then
  echo "examples/rust-orders/Cargo.toml's rust-version is not $msrv" >&2
  exit 1
fi
# The highest rust-version among the packages an --all-features build resolves.
sqlx_msrv=$(release "$(cargo metadata --locked --format-version 1 --all-features | python3 -c '
import json, sys
versions = [p["rust_version"] for p in json.load(sys.stdin)["packages"] if p["rust_version"]]
print(max(versions, key=lambda v: [int(n) for n in v.split(".")]))')")

# The TLS cluster for tests/tls.rs, stopped on exit; the tests' output, to count them.
log=$(mktemp)
tls_base=""
trap 'rm -f "$log"; [[ -z $tls_base ]] || { tls_cluster_stop "$tls_base/tls"; rm -rf "$tls_base"; }' EXIT
if [[ -n ${PGHOST:-} && -z ${IDEM_RUST_TLS_PORT:-} ]]; then
  # shellcheck source=../../../tests/integration/lib/tls_cluster.bash
  source ../../tests/integration/lib/tls_cluster.bash
  tls_base=$(mktemp -d)
  tls_certificates "$tls_base/tls" 2>/dev/null
  tls_cluster_start "$tls_base/tls" $((PGPORT + 14))
  export IDEM_RUST_TLS_PORT=$((PGPORT + 14)) IDEM_RUST_TLS_CA=$tls_base/tls/certs/ca.pem
  export IDEM_RUST_TLS_OTHER_CA=$tls_base/tls/certs/other.pem
fi

check() {  # check TOOLCHAIN CARGO_FLAGS...
  local toolchain=$1
  shift
  echo "== Rust $toolchain: cargo build --locked --all-targets $*"
  rustup toolchain list | grep -q "^$toolchain-" ||
    rustup toolchain install "$toolchain" --profile minimal
  cargo "+$toolchain" build --locked --all-targets "$@"
  local targets=(--test http --test docs_example)
  if [[ -n ${PGHOST:-} ]]; then
    targets=(--tests)
  fi
  {
    cargo "+$toolchain" test --locked "$@" --doc
    cargo "+$toolchain" test --locked "$@" --lib "${targets[@]}"
  } 2>&1 | tee "$log"
  echo "== Rust $toolchain${*:+ $*}: $(awk '/^test result:/ { n += $4 } END { print n }' "$log") tests passed"
}

check "$msrv"
check "$msrv" --features axum
echo "== Rust $msrv: examples/rust-orders, cargo build --locked --all-targets"
(cd ../../examples/rust-orders && cargo "+$msrv" build --locked --all-targets)
check "$sqlx_msrv" --all-features
echo "ok: Rust $msrv builds the crate (no features, axum) and examples/rust-orders, $sqlx_msrv with sqlx"
