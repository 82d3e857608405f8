#!/usr/bin/env bash
# Installs every Debian package the build, the tests, the demo and the
# benchmarks need. Runs apt-get only when something is missing. Needs root (or sudo).
#
#   IDEM_PG_VERSION   PostgreSQL major version (default 15, Debian bookworm's);
#                     17 in trixie, 18 in forky (scripts/test-matrix.sh)
#   IDEM_TEST_SCOPE   full (default): also the fuzzer's clang, wrk, node and pgjdbc;
#                     matrix: only what the suite run inside a chroot needs
set -euo pipefail

version=${IDEM_PG_VERSION:-15}
scope=${IDEM_TEST_SCOPE:-full}

packages=(
  build-essential cmake pkg-config
  "postgresql-$version" "postgresql-server-dev-$version" "postgresql-$version-cron" "postgresql-$version-pgtap"
  "postgresql-$version-plproxy"  # tests/scale-out: PL/Proxy (bookworm 2.10, trixie 2.11, forky 2.12)
  libtap-parser-sourcehandler-pgtap-perl
  libssl-dev libfast-float-dev libgtest-dev googletest
  libpqxx-dev nlohmann-json3-dev libcpp-httplib-dev pgbouncer
  curl bc git  # git: scripts/test-matrix.sh copies the work tree with git ls-files
  # /usr/bin/python3's own: psycopg and yaml for the test tools (tests/conformance, tests/model,
  # monitoring_queries); venv for client/python, whose tests and example services run in a venv
  # with psycopg's compiled speedups, Django and Starlette from the package index
  # (client/python/tools/env.sh).
  python3-psycopg python3-venv python3-yaml
)
if [[ $scope == full ]]; then
  packages+=(clang-14 libclang-rt-14-dev clang-format wrk debootstrap)  # debootstrap: scripts/test-matrix.sh
  # node (differential tests, benchmark peers) ships with the machine; Debian's
  # nodejs/npm only where it is missing (they conflict with a preinstalled node).
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
  # pgjdbc for tests/languages/JdbcForms.java; a JDK (single-file source launch)
  # ships with the machine too, Debian's only where javac is missing.
  packages+=(libpostgresql-jdbc-java)
  # Go for client/go, examples/go-orders and tests/languages/pgx_forms.go: modules
  # (pgx v5, River) come from the Go module proxy at build time, pinned by each
  # module's go.sum. The machine ships Go 1.26 (/usr/local/go); client/go says go 1.25,
  # examples/go-orders go 1.26 (River 0.51's own minimum).
  # Debian's golang-go only where no go is on PATH (bookworm's 1.19 is too old for them).
  command -v go >/dev/null || packages+=(golang-go)
  # Rust for client/rust and examples/rust-orders: the machine's rustup toolchain (cargo,
  # rustc 1.88 or later, rustfmt, clippy), the crates from the crate registry pinned by
  # each Cargo.lock; openssl makes the TLS test cluster's certificates
  # (tests/integration/rust_client.sh).
  packages+=(openssl)
  command -v javac >/dev/null || packages+=(default-jdk-headless)
else
  # procps: ps and kill for the tests' helpers in a minimal chroot.
  packages+=(procps)
fi
# gdb: tests/integration/lock_timeout_race.sh holds a backend at one instant
# (on the host and in the 17/18 chroots: the timers differ between majors).
# ccache: scripts/test.sh compiles through it, so a second run (or a chroot
# kept in the matrix cache) does not compile an unchanged file again.
packages+=(gdb ccache)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
