#!/usr/bin/env bash
# client/rust/tools/msrv.sh: builds the crate with the oldest Rust it says it supports.
#
# The toolchain named by Cargo.toml's rust-version builds the crate without features and
# with `axum`, and examples/rust-orders (its own rust-version must be the same); the
# feature `sqlx` (--all-features) is built with the highest rust-version among the locked
# crates it pulls in (sqlx's). A toolchain that is missing is installed with rustup
# (--profile minimal: no clippy, no rustfmt). For each: `cargo build --locked
# --all-targets`, then the tests that need no database (unit, doc, http.rs,
# docs_example.rs); with a cluster's env sourced (PGHOST, PGPORT, PGUSER, PGDATABASE of
# a database with the extension) every test file against it, tls.rs only with the
# IDEM_RUST_TLS_* that tests/integration/rust_client.sh sets.
#
# Run by hand: not in CI and not in scripts/test.sh, because it downloads toolchains from
# rustup's own server, which CI's machines may not reach. Builds into
# ~/.cache/idempotency/cargo-target-msrv (CARGO_TARGET_DIR overrides).
#
#     client/rust/tools/msrv.sh
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

check() {  # check TOOLCHAIN CARGO_FLAGS...
  local toolchain=$1
  shift
  echo "== Rust $toolchain: cargo build --locked --all-targets $*"
  rustup toolchain list | grep -q "^$toolchain-" ||
    rustup toolchain install "$toolchain" --profile minimal
  cargo "+$toolchain" build --locked --all-targets "$@"
  cargo "+$toolchain" test --locked "$@" --lib --test http --test docs_example
  cargo "+$toolchain" test --locked "$@" --doc
  if [[ -n ${PGHOST:-} ]]; then
    local targets=()
    for file in tests/*.rs; do
      name=$(basename "$file" .rs)
      if [[ $name != tls || -n ${IDEM_RUST_TLS_PORT:-} ]]; then
        targets+=(--test "$name")
      fi
    done
    cargo "+$toolchain" test --locked "$@" "${targets[@]}"
  fi
}

check "$msrv"
check "$msrv" --features axum
echo "== Rust $msrv: examples/rust-orders, cargo build --locked --all-targets"
(cd ../../examples/rust-orders && cargo "+$msrv" build --locked --all-targets)
check "$sqlx_msrv" --all-features
echo "ok: Rust $msrv builds the crate (no features, axum) and examples/rust-orders, $sqlx_msrv with sqlx"
