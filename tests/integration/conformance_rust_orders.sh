#!/usr/bin/env bash
# The HTTP conformance suite (tests/conformance) against the Rust example,
# examples/rust-orders (hyper 0.14, client/rust's Client::handle), on a fresh
# database of the throwaway cluster. Builds the example with Debian's cargo and
# rustc, offline (release profile, target folder build/rust shared with client/rust).
# Host only (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ ! -x /usr/bin/cargo || ! -x /usr/bin/rustc ]]; then
  echo "not ok - Debian's cargo and rustc are not installed (scripts/install-deps.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
(cd examples/rust-orders && PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc /usr/bin/cargo build --release --quiet)
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_conformance_rust
port=$((PGPORT + 12))
start_service "$port" build/rust/release/rust-orders
wait_for_tables orders api_keys
/usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
