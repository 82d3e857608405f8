#!/usr/bin/env bash
# The HTTP conformance suite (tests/conformance) against the Rust example,
# examples/rust-orders (client/rust's Client::handle), on a fresh database of the
# throwaway cluster. Builds the example with the machine's cargo (rustup), its
# crates from the crate registry pinned by examples/rust-orders/Cargo.lock
# (--locked), release profile, into build/rust (CARGO_TARGET_DIR, shared with
# tests/integration/rust_client.sh). Host only (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v cargo >/dev/null; then
  echo "not ok - cargo (rustup's toolchain, Rust 1.88 or later) is not on PATH"
  echo "0 passed, 1 failed"
  exit 1
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/build/rust}
(cd examples/rust-orders && cargo build --release --locked --quiet)
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_conformance_rust
port=$((PGPORT + 12))
start_service "$port" "$CARGO_TARGET_DIR/release/rust-orders"
wait_for_tables orders api_keys
/usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
