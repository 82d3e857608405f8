#!/usr/bin/env bash
# client/rust: the generated constants are not stale, no protocol table written by hand,
# cargo fmt, clippy -D warnings, cargo doc without warnings, cargo package, and the cargo
# tests (unit, transactional, lease, the framework-shaped calls, batches, queue, router,
# streams, TLS) against a fresh database of the run's cluster (PGHOST/PGPORT/PGUSER), and
# the TLS tests against a second throwaway cluster on PGPORT+14 with ssl = on and a
# certificate of a CA made here with openssl (IDEM_RUST_TLS_*). Builds with the
# machine's cargo (rustup), the crates from the crate registry pinned by
# client/rust/Cargo.lock (--locked), release profile, into build/rust (CARGO_TARGET_DIR,
# shared with conformance_rust_orders.sh). Host only (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
if ! command -v cargo >/dev/null || ! command -v openssl >/dev/null; then
  echo "not ok - cargo (rustup's toolchain, Rust 1.88 or later) and openssl are on PATH"
  echo "0 passed, 1 failed"
  exit 1
fi
repo=$(pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/build/rust}
fresh_database idem_rust_client

# client/rust/src/generated.rs is generated from client/protocol.json: a fresh run
# must give the committed file byte for byte (a stale file fails here).
protocol_gen_fresh() {
  /usr/bin/python3 tools/protocol_gen.py rust >"$work/generated.rs" &&
    diff -u client/rust/src/generated.rs "$work/generated.rs"
}
check "tools/protocol_gen.py rust: client/rust/src/generated.rs is not stale" protocol_gen_fresh
no_hand_table() {
  ! grep -nE '"(/problems/|idempotency-key-|request-in-progress|one-time-secret|response-not-kept|request-body-invalid|database-unavailable|Idempotent-Replay|Idempotency-Expires|Idempotency-Key"|application/problem\+json)' \
    $(find client/rust/src -name '*.rs' ! -name generated.rs)
}
check "client/rust: no problem type or protocol header written by hand" no_hand_table
# Layers point down: no circle among the crate's top-level modules (a module's
# `crate::NAME` paths are its arrows; a submodule belongs to its parent).
no_module_circle() {
  /usr/bin/python3 - client/rust/src <<'PY'
import glob, re, sys
root = sys.argv[1]
arrows = {}
for path in glob.glob(root + "/**/*.rs", recursive=True):
    name = path[len(root) + 1:-3].split("/")[0]
    if name == "lib":
        continue
    text = open(path, encoding="utf-8").read()
    arrows.setdefault(name, set()).update(set(re.findall(r"crate::(\w+)", text)) - {name})
state = {}
def visit(node, path):
    state[node] = "open"
    for target in sorted(arrows.get(node, ())):
        if state.get(target) == "open":
            sys.exit("a circle: " + " -> ".join(path + [target]))
        if target not in state:
            visit(target, path + [target])
    state[node] = "done"
for module in sorted(arrows):
    if module not in state:
        visit(module, [module])
PY
}
check "client/rust: no circle among the modules" no_module_circle
check "client/rust: no Debian source replacement, no shared target-dir" \
  bash -c '! ls client/rust/.cargo examples/rust-orders/.cargo 2>/dev/null | grep -q .'
check "cargo fmt --check: client/rust and examples/rust-orders" \
  bash -c 'cd client/rust && cargo fmt --check && cd ../../examples/rust-orders && cargo fmt --check'
check "cargo clippy -D warnings: client/rust (every feature, tests) and examples/rust-orders" \
  bash -c 'cd client/rust && cargo clippy --locked --release --all-features --all-targets -q -- -D warnings &&
    cd ../../examples/rust-orders && cargo clippy --locked --release -q -- -D warnings'
check "cargo doc without warnings: client/rust" \
  env RUSTDOCFLAGS="-D warnings" bash -c 'cd client/rust && cargo doc --locked --no-deps --all-features -q'
check "cargo package: client/rust packages (--no-verify)" \
  bash -c 'cd client/rust && cargo package --locked --allow-dirty --no-verify -q'

# The TLS cluster (tests/integration/lib/tls_cluster.bash): a CA, the server's certificate
# for 127.0.0.1 and localhost signed by it, and another CA whose trust must not be enough.
# shellcheck source=lib/tls_cluster.bash
source tests/integration/lib/tls_cluster.bash
tls_dir=$work/tls
tls_port=$((PGPORT + 14))
trap 'tls_cluster_stop "$tls_dir"; cleanup_service_test' EXIT
check "openssl: a CA and a server certificate for the TLS cluster" tls_certificates "$tls_dir" 2>/dev/null
check "a throwaway cluster with ssl = on on port $tls_port" tls_cluster_start "$tls_dir" "$tls_port"

check "cargo test: client/rust against the cluster (and the TLS one)" \
  env PGDATABASE="$service_db" IDEM_RUST_TLS_PORT="$tls_port" \
  IDEM_RUST_TLS_CA="$tls_dir/certs/ca.pem" IDEM_RUST_TLS_OTHER_CA="$tls_dir/certs/other.pem" \
  bash -c 'cd client/rust && cargo test --locked --release --all-features 2>&1'
report
