#!/usr/bin/env bash
# The test command. Installs missing Debian packages, then runs the suites of
# the SUITES table below for one tier, and ends with "N passed, N failed".
#
#   scripts/test.sh           the whole run (.ci/run): every suite on the host's
#                             PostgreSQL (15 on bookworm), the sanitizer build,
#                             the model checker (about 3 min), fuzzing
#                             (FUZZ_SECONDS, default 60), the Debian packages for
#                             15 in a clean chroot, PostgreSQL 17 and 18 in Debian
#                             chroots (scripts/test-matrix.sh) and the keys moved
#                             15 -> 17 -> 18: 20-40 minutes on 2 cores
#   scripts/test.sh --quick   before each commit: format, build, unit and
#                             differential tests, pg_regress and isolation, the
#                             clients, the conformance suite, the doc blocks and a
#                             short model run; no chroots
#
#   IDEM_PG_VERSION   PostgreSQL major version to build and test against
#                     (default: the one `pg_config` on PATH names, or PG_CONFIG's)
#   IDEM_TEST_SCOPE   full (default) or matrix: matrix is the tier that
#                     scripts/test-matrix.sh runs inside a chroot (no sanitizer
#                     build, no fuzzing, no bench build, no node/Java/Go, no
#                     nested matrix; a short model run)
#   IDEM_MATRIX       versions for scripts/test-matrix.sh (default "17 18"; empty: none)
#   IDEM_TEST_PORT    the cluster's port (default: random in 20000-25999)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scope=${IDEM_TEST_SCOPE:-full}
# The tier: f (the whole run), q (--quick), m (inside a matrix chroot).
tier=f
[[ $scope == matrix ]] && tier=m
if [[ ${1:-} == --quick ]]; then
  tier=q
elif [[ -n ${1:-} ]]; then
  echo "usage: scripts/test.sh [--quick]" >&2
  exit 2
fi
# Without IDEM_PG_VERSION, the server that PG_CONFIG or pg_config on PATH names
# (none yet on a fresh machine: install-deps.sh then installs bookworm's 15).
if [[ -z ${IDEM_PG_VERSION:-} ]] && pg_config_cmd=${PG_CONFIG:-$(command -v pg_config)}; then
  IDEM_PG_VERSION=$("$pg_config_cmd" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
  export IDEM_PG_VERSION PG_CONFIG=$pg_config_cmd
  export PGBIN=${PGBIN:-$("$pg_config_cmd" --bindir)}
fi
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
bench=OFF
[[ $tier == f ]] && bench=ON
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

cluster=$(mktemp -d /tmp/idem-test.XXXXXX)
# Below the kernel's ephemeral range (32768-60999), where an outgoing
# connection's local port could take the port of a cluster or a service that
# a test starts at port + N (seen: "Address already in use" for port + 30),
# and below the fixed ports of other suites (chroots 28000+). The model
# checker's clusters take port + 40 to + 46.
port=${IDEM_TEST_PORT:-$((20000 + RANDOM % 6000))}
cluster_up=0
trap 'scripts/pgcluster.sh stop "$cluster/pg"; rm -rf "$cluster"' EXIT
start_cluster() {
  if scripts/pgcluster.sh start "$cluster/pg" "$port"; then
    # shellcheck disable=SC1091
    source "$cluster/pg/env"
    cluster_up=1
  else
    failed=$((failed + 1))
    failures+=("start throwaway cluster")
  fi
}
# The chroots' clusters use ports of their own; this run's cluster is stopped first.
stop_cluster() { scripts/pgcluster.sh stop "$cluster/pg"; cluster_up=0; }

regress() { make -s installcheck || { cat regression.diffs output_iso/regression.diffs 2>/dev/null | head -200; return 1; }; }
# The same suite in the distributed mode: every read and write of the key
# table by SQL statements, as under Citus (docs/scale-out.md).
regress_distributed() { PGOPTIONS="-c idempotency.distributed=on" regress; }

# Integration tests: every tests/integration/*.sh, one suite each. --quick runs
# the ones below; the matrix chroots have no node, Java or Go.
quick_integration=" client conformance_orders_service conformance_python_orders conformance_node_orders docs_blocks "
host_only=" conformance_node_orders conformance_go_orders go_client conformance_rust_orders rust_client languages_jdbc languages_pgx trusted_edition "
integration_tests() {
  local t name
  for t in tests/integration/*.sh; do
    [[ -e $t ]] || continue
    name=$(basename "$t" .sh)
    [[ $tier == q && $quick_integration != *" $name "* ]] && continue
    [[ $tier == m && $host_only == *" $name "* ]] && continue
    suite "integration: $name" bash "$t"
  done
}
model_short() {
  # --quick: one fixed seed and the random one, no distributed or PL/Proxy form
  # (the whole run has them).
  if [[ $tier == q ]]; then
    MODEL_SEEDS="11" MODEL_SECONDS=15 MODEL_DISTRIBUTED_SECONDS=0 MODEL_PROXY_SECONDS=0 tests/model/ci.sh
  else
    MODEL_SEEDS="11 23" MODEL_SECONDS=15 tests/model/ci.sh
  fi
}
fuzz() { scripts/fuzz.sh "${FUZZ_SECONDS:-60}"; }
matrix_versions() {
  local v
  for v in ${IDEM_MATRIX-17 18}; do
    suite "PostgreSQL $v in a Debian chroot (scripts/test-matrix.sh $v)" scripts/test-matrix.sh "$v"
  done
}
# The Debian packages of 15, installed into a clean bookworm chroot (17 and 18
# get theirs in their matrix runs), and the keys moved between versions.
packages_15() { IDEM_MATRIX_SUITE=0 scripts/test-matrix.sh 15; }
major_upgrade() { scripts/test-matrix.sh --major-upgrade; }
with_matrix() { [[ -n ${IDEM_MATRIX-17 18} ]]; }

# The suites, in order. Tiers: f = the whole run, q = --quick, m = inside a
# matrix chroot. Needs: c = the run's cluster is up; x = IDEM_MATRIX is not
# empty. A name of "-" runs the command as a step (it reports its own suites).
SUITES=(
  # tiers | needs | name | command
  "fq  |   | format (clang-format, .clang-format)                          | scripts/check-format.sh"
  "fq  |   | structure (layers, file sizes, function lengths)              | /usr/bin/python3 scripts/check-structure.py"
  "fqm |   | extension build (PGXS, -Werror) and install                   | build_extension"
  "fqm |   | C++ build (CMake, -Werror)                                    | build_cpp"
  "fqm |   | ctest: unit and differential tests                            | run_ctest"
  "fqm |   | META.json (PGXN meta spec 1.0.0)                              | /usr/bin/python3 tests/meta/check_meta.py"
  "f   |   | ctest under AddressSanitizer + UBSan                          | sanitizer_tests"
  "fqm |   | -                                                             | start_cluster"
  "fqm | c | pg_regress and isolation specs                                | regress"
  "fm  | c | pg_regress and isolation specs, distributed mode (idempotency.distributed = on) | regress_distributed"
  "fqm | c | Python client (pip install, pytest)                           | python_client_tests"
  "fq  | c | Node client (npm install, tsc, node --test)                   | node_client_tests"
  "fqm | c | -                                                             | integration_tests"
  # Its own cluster (it restarts and crashes it on purpose), after the
  # integration tests: about 3 minutes on the host, a short run elsewhere.
  "f   | c | model checker                                                 | tests/model/ci.sh"
  "qm  | c | model checker (short run)                                     | model_short"
  "f   |   | fuzz canonicalizer (${FUZZ_SECONDS:-60} s)                    | fuzz"
  "f   |   | -                                                             | stop_cluster"
  "f   | x | Debian packages for PostgreSQL 15 in a clean bookworm chroot  | packages_15"
  "f   | x | -                                                             | matrix_versions"
  "f   | x | keys moved 15 -> 17 -> 18 (pg_dump/pg_restore, scripts/test-matrix.sh --major-upgrade) | major_upgrade"
)
trim() { local v=$1; v=${v#"${v%%[![:space:]]*}"}; echo "${v%"${v##*[![:space:]]}"}"; }
for row in "${SUITES[@]}"; do
  IFS='|' read -r tiers needs name command <<<"$row"
  tiers=$(trim "$tiers") needs=$(trim "$needs") name=$(trim "$name") command=$(trim "$command")
  [[ $tiers == *$tier* ]] || continue
  [[ $needs == *c* ]] && ((!cluster_up)) && continue
  [[ $needs == *x* ]] && ! with_matrix && continue
  # shellcheck disable=SC2086 # the command is words from the table
  if [[ $name == - ]]; then $command; else suite "$name" $command; fi
done

echo
if ((failed)); then
  printf 'failed suite: %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed"
((failed == 0))
