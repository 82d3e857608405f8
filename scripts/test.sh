#!/usr/bin/env bash
# Sets up and runs every test: installs missing Debian packages, builds the
# extension (warnings are errors) and installs it, builds the C++ tests, runs
# ctest (unit, differential against node/V8), the sanitizer build of the core
# tests, starts a throwaway PostgreSQL 15 cluster (pg_cron preloaded) and runs
# pg_regress, the isolation specs, pgTAP and the integration tests against it,
# the model checker (tests/model/ci.sh, on a cluster of its own, about 3 min),
# then fuzzes the canonicalizer for FUZZ_SECONDS (default 60). The cluster is
# stopped on any exit. Then runs the same suite on PostgreSQL 17 and 18, each
# in a Debian chroot (scripts/test-matrix.sh), one suite line per version.
# Ends with "N passed, N failed" over the suites.
#
#   IDEM_PG_VERSION   PostgreSQL major version to build and test against
#                     (default: the one of `pg_config`, 15 on bookworm)
#   IDEM_TEST_SCOPE   full (default) or matrix: what scripts/test-matrix.sh runs
#                     inside a chroot (no sanitizer build, no fuzzing, no bench
#                     build, no nested matrix; the model checker when present)
#   IDEM_MATRIX       versions for scripts/test-matrix.sh (default "17 18"; empty: none)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scope=${IDEM_TEST_SCOPE:-full}
if [[ -n ${IDEM_PG_VERSION:-} ]]; then
  export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/$IDEM_PG_VERSION/bin/pg_config}
  export PGBIN=${PGBIN:-/usr/lib/postgresql/$IDEM_PG_VERSION/bin}
fi

scripts/install-deps.sh || { echo "0 passed, 1 failed"; exit 1; }

jobs=$(nproc)
passed=0
failed=0
failures=()
suite() {
  local name=$1
  shift
  echo
  echo "=== $name"
  local start=$SECONDS
  if "$@"; then
    passed=$((passed + 1))
    echo "--- $name: ok ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "--- $name: FAILED ($((SECONDS - start)) s)"
  fi
}

build_extension() { make -s clean >/dev/null 2>&1; make -s -j"$jobs" WERROR=1 && make -s install; }
bench=ON
[[ $scope == matrix ]] && bench=OFF
build_cpp() {
  cmake -S . -B build-test -DIDEM_WERROR=ON -DIDEM_BUILD_BENCH=$bench -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build build-test -j"$jobs"
}
run_ctest() { (cd build-test && ctest --output-on-failure -j"$jobs"); }
sanitizer_tests() {
  cmake -S . -B build-asan -DIDEM_WERROR=ON -DIDEM_SANITIZE=ON -DIDEM_BUILD_CLIENT=OFF -DIDEM_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=Debug >/dev/null &&
    cmake --build build-asan -j"$jobs" --target core_tests jcs_tool &&
    (cd build-asan && ctest --output-on-failure -j"$jobs")
}

# The Python package installed the way users install it (pip, Debian's
# setuptools, no index) into a throwaway venv that sees Debian's psycopg and
# pytest; its tests then run against the installed copy and start their own
# cluster. pytest's exit status 5 (no tests collected) is a failure like any other.
python_client_tests() {
  local venv status
  venv=$(mktemp -d /tmp/idem-py.XXXXXX)
  if ! /usr/bin/python3 -m venv --system-site-packages "$venv/env" ||
     ! "$venv/env/bin/python" -m pip install -q --no-build-isolation --no-index ./client/python; then
    rm -rf "$venv" client/python/build
    return 1
  fi
  rm -rf client/python/build
  (cd client/python/tests &&
     IDEM_EXPECT_INSTALLED=1 IDEM_PYTEST_PORT=$((port + 20)) "$venv/env/bin/python" -m pytest -q -p no:cacheprovider .)
  status=$?
  rm -rf "$venv"
  ((status == 5)) && echo "pytest collected no tests"
  return "$status"
}

# The Node package built the way users build it (npm install, whose prepare
# step runs tsc), then its tests (node --test) against a cluster they start
# themselves. npm's lock file is not kept (.gitignore), like bench/'s.
node_client_tests() {
  (cd client/node &&
     npm install --no-package-lock --no-audit --no-fund --loglevel=error &&
     npm run --silent build &&
     IDEM_NODE_TEST_PORT=$((port + 21)) node test/run.js)
}

[[ $scope == full ]] && suite "format (clang-format, .clang-format)" scripts/check-format.sh
suite "extension build (PGXS, -Werror) and install" build_extension
suite "C++ build (CMake, -Werror)" build_cpp
suite "ctest: unit and differential tests" run_ctest
suite "META.json (PGXN meta spec 1.0.0)" /usr/bin/python3 tests/meta/check_meta.py
[[ $scope == full ]] && suite "ctest under AddressSanitizer + UBSan" sanitizer_tests

cluster=$(mktemp -d /tmp/idem-test.XXXXXX)
# Below the kernel's ephemeral range (32768-60999), where an outgoing
# connection's local port could take the port of a cluster or a service that
# a test starts at port + N (seen: "Address already in use" for port + 30),
# and below the fixed ports of other suites (model checker's proxy form 26600,
# chroots 28000+).
port=${IDEM_TEST_PORT:-$((20000 + RANDOM % 6000))}
trap 'scripts/pgcluster.sh stop "$cluster/pg"; rm -rf "$cluster"' EXIT
if scripts/pgcluster.sh start "$cluster/pg" "$port"; then
  # shellcheck disable=SC1091
  source "$cluster/pg/env"
  regress() { make -s installcheck || { cat regression.diffs 2>/dev/null | head -200; return 1; }; }
  suite "pg_regress and isolation specs" regress
  # The same suite in the distributed mode: every read and write of the key
  # table by SQL statements, as under Citus (docs/scale-out.md).
  regress_distributed() { PGOPTIONS="-c idempotency.distributed=on" regress; }
  suite "pg_regress and isolation specs, distributed mode (idempotency.distributed = on)" regress_distributed
  suite "Python client (pip install, pytest)" python_client_tests
  # Node, Java and Go are on the host only; the chroots of the matrix have none of them.
  [[ $scope == full ]] && suite "Node client (npm install, tsc, node --test)" node_client_tests
  host_only=" conformance_node_orders languages_jdbc languages_pgx rust_client conformance_rust_orders "
  for t in tests/integration/*.sh; do
    [[ -e $t ]] || continue
    [[ $scope == matrix && $host_only == *" $(basename "$t" .sh) "* ]] && continue
    suite "integration: $(basename "$t" .sh)" bash "$t"
  done
  # Its own cluster (it restarts and crashes it on purpose), after the
  # integration tests: about 3 minutes on the host, a short run in the chroots.
  if [[ $scope == matrix ]]; then
    suite "model checker (short run)" env MODEL_SEEDS="11 23" MODEL_SECONDS=15 tests/model/ci.sh
  else
    suite "model checker" tests/model/ci.sh
  fi
else
  failed=$((failed + 1))
  failures+=("start throwaway cluster")
fi

if [[ $scope == full ]]; then
  suite "fuzz canonicalizer (${FUZZ_SECONDS:-60} s)" scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
  # The cluster of this run is stopped first: the chroots' clusters use ports of their own.
  scripts/pgcluster.sh stop "$cluster/pg"
  # The Debian packages of 15, installed into a clean bookworm chroot (17 and
  # 18 get theirs in their matrix runs).
  if [[ -n ${IDEM_MATRIX-17 18} ]]; then
    suite "Debian packages for PostgreSQL 15 in a clean bookworm chroot" \
      env IDEM_MATRIX_SUITE=0 scripts/test-matrix.sh 15
  fi
  for v in ${IDEM_MATRIX-17 18}; do
    suite "PostgreSQL $v in a Debian chroot (scripts/test-matrix.sh $v)" scripts/test-matrix.sh "$v"
  done
  if [[ -n ${IDEM_MATRIX-17 18} ]]; then
    suite "keys moved 15 -> 17 -> 18 (pg_dump/pg_restore, scripts/test-matrix.sh --major-upgrade)" \
      scripts/test-matrix.sh --major-upgrade
  fi
fi

echo
if ((failed)); then
  printf 'failed suite: %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed"
((failed == 0))
