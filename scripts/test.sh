#!/usr/bin/env bash
# Sets up and runs every test: installs missing Debian packages, builds the
# extension (warnings are errors) and installs it, builds the C++ tests, runs
# ctest (unit, differential against node/V8), the sanitizer build of the core
# tests, starts a throwaway PostgreSQL 15 cluster (pg_cron preloaded) and runs
# pg_regress, the isolation specs, pgTAP and the integration tests against it,
# the model checker (tests/model/ci.sh, on a cluster of its own, about 3 min),
# then fuzzes the canonicalizer for FUZZ_SECONDS (default 60). The cluster is
# stopped on any exit. Ends with "N passed, N failed" over the suites.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

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
build_cpp() {
  cmake -S . -B build-test -DIDEM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
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
     ! "$venv/env/bin/python" -m pip install -q --no-build-isolation --no-index ./clients/python; then
    rm -rf "$venv" clients/python/build
    return 1
  fi
  rm -rf clients/python/build
  (cd clients/python/tests &&
     IDEM_EXPECT_INSTALLED=1 IDEM_PYTEST_PORT=$((port + 20)) "$venv/env/bin/python" -m pytest -q -p no:cacheprovider .)
  status=$?
  rm -rf "$venv"
  ((status == 5)) && echo "pytest collected no tests"
  return "$status"
}

suite "extension build (PGXS, -Werror) and install" build_extension
suite "C++ build (CMake, -Werror)" build_cpp
suite "ctest: unit and differential tests" run_ctest
suite "ctest under AddressSanitizer + UBSan" sanitizer_tests

cluster=$(mktemp -d /tmp/idem-test.XXXXXX)
port=${IDEM_TEST_PORT:-$((20000 + RANDOM % 20000))}
trap 'scripts/pgcluster.sh stop "$cluster/pg"; rm -rf "$cluster"' EXIT
if scripts/pgcluster.sh start "$cluster/pg" "$port"; then
  # shellcheck disable=SC1091
  source "$cluster/pg/env"
  regress() { make -s installcheck || { cat regression.diffs 2>/dev/null | head -200; return 1; }; }
  suite "pg_regress and isolation specs" regress
  suite "Python client (pip install, pytest)" python_client_tests
  for t in tests/integration/*.sh; do
    [[ -e $t ]] || continue
    suite "integration: $(basename "$t" .sh)" bash "$t"
  done
  # Its own cluster (it restarts and crashes it on purpose), after the integration tests.
  suite "model checker" tests/model/ci.sh
else
  failed=$((failed + 1))
  failures+=("start throwaway cluster")
fi

suite "fuzz canonicalizer (${FUZZ_SECONDS:-60} s)" scripts/fuzz.sh "${FUZZ_SECONDS:-60}"

echo
if ((failed)); then
  printf 'failed suite: %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed"
((failed == 0))
