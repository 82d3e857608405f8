#!/usr/bin/env bash
# client/rust's cargo tests (unit, the HTTP table against client/protocol.json, and
# the lease and transactional suites) against a fresh database of the run's cluster
# (PGHOST/PGPORT/PGUSER). Builds with Debian's cargo and rustc (/usr/bin), offline
# from Debian's crates (client/rust/.cargo/config.toml), into build/rust, the target
# folder it shares with examples/rust-orders; release profile, like the example, so
# the two share their dependencies' builds. Host only (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ ! -x /usr/bin/cargo || ! -x /usr/bin/rustc ]]; then
  echo "not ok - Debian's cargo and rustc are not installed (scripts/install-deps.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_rust_client
export PGDATABASE=$service_db
cd client/rust
PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc /usr/bin/cargo test --release --features hyper 2>&1
