#!/usr/bin/env bash
# The test command. Installs missing Debian packages, then runs the suites of
# the SUITES table below, and ends with a table (suite, result, seconds) and
# "N passed, N failed".
#
#   scripts/test.sh            the whole run (.ci/run): every suite on the host's
#                              PostgreSQL (15 on bookworm), the sanitizer build, the
#                              model checker, fuzzing (FUZZ_SECONDS, default 60), and
#                              in Debian chroots beside them (a background stream that
#                              overlaps the host's suites): the Debian packages of 15,
#                              PostgreSQL 17 and 18 (what depends on the server's major
#                              version) and the keys moved 15 -> 17 -> 18
#   scripts/test.sh --quick    before each commit: format, build, unit and differential
#                              tests, pg_regress and isolation, the clients, the
#                              conformance suite, the doc blocks, a short model run
#   scripts/test.sh --list     every suite's name, tiers and last measured time
#   scripts/test.sh NAME...    only those suites (and what they need: the extension
#                              built and installed, the C++ build, the cluster)
#
#   IDEM_PG_VERSION   PostgreSQL major version to build and test against
#                     (default: the one `pg_config` on PATH names, or PG_CONFIG's)
#   IDEM_TEST_SCOPE   full (default) or matrix: matrix is the tier that
#                     scripts/test-matrix.sh runs inside a chroot (what depends on
#                     the server's major version, libpqxx's and the compiler's)
#   IDEM_MATRIX       versions for the chroot suites (default "17 18"; empty: no chroots)
#   IDEM_TEST_PORT    the cluster's port (default: random in 20000-25999)
#   IDEM_TEST_SERIAL=1  the chroot suites after the host's, not beside them
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scope=${IDEM_TEST_SCOPE:-full}
usage() {
  echo "usage: scripts/test.sh [--quick | --list | NAME...]" >&2
  exit 2
}
# The tier: f (the whole run), q (--quick), m (inside a matrix chroot), n (by name).
tier=f
[[ $scope == matrix ]] && tier=m
chosen=()
listing=0
case ${1:-} in
--quick) tier=q; (($# == 1)) || usage ;;
--list) listing=1; (($# == 1)) || usage ;;
-*) usage ;;
"") ;;
*) tier=n; chosen=("$@") ;;
esac

# Measured times: the last run's per suite on this machine (build/test-times.tsv),
# else the reference of tests/suite-times.tsv (docs/testing.md).
times_file=$root/build/test-times.tsv
reference_times=$root/tests/suite-times.tsv

# Integration tests: every tests/integration/*.sh is a suite of its own name.
# --quick runs the first list; the matrix chroots run the second (what depends on
# the server's major version or libpqxx's; the rest runs once, on the host).
quick_integration=" client conformance_orders_service conformance_python_orders conformance_django_orders
  conformance_node_orders conformance_fastify_orders docs_blocks "
quick_integration=" $(echo $quick_integration) "
matrix_integration=" binding_paths cancel_long_calls client client_install counters_server fences_survive
  installcheck_no_preload json_depth_immutable lock_timeout_race monitoring_queries no_preload orders_service pg_cron pgtap
  scale_out_plproxy stress_same_key "
matrix_integration=" $(echo $matrix_integration) "
# Those that use the C++ build (build-test): the client, its examples, jcs_tool.
cpp_integration=" client client_install conformance_orders_service docs_blocks faults fingerprints orders_service proxy_service "
# Those that use the Node client as built (client/node/dist): its examples, the doc blocks.
node_integration=" conformance_node_orders conformance_fastify_orders docs_blocks faults fingerprints "

# The suites, in order. Tiers: f = the whole run, q = --quick, m = inside a
# matrix chroot. Needs: e = the extension built and installed, b = the C++ build,
# n = the Node client built, c = the run's cluster; x = a chroot suite (the background stream of the whole
# run; left out when IDEM_MATRIX is empty). "@integration" stands for the
# integration tests, in file order.
SUITES=(
  # tiers | needs | name | title | command
  "fq  |     | format            | format (clang-format, .clang-format)                     | scripts/check-format.sh"
  "fq  |     | structure         | structure (layers, file sizes, function lengths)         | /usr/bin/python3 scripts/check-structure.py"
  "fqm |     | extension         | extension build (PGXS, -Werror) and install              | build_extension"
  "fqm |     | cpp_build         | C++ build (CMake, -Werror)                               | build_cpp"
  "fqm | b   | ctest             | ctest: unit and differential tests                       | run_ctest"
  "fq  |     | meta              | META.json (PGXN meta spec 1.0.0)                         | /usr/bin/python3 tests/meta/check_meta.py"
  "f   |     | asan              | ctest under AddressSanitizer + UBSan                     | sanitizer_tests"
  "fqm | ec  | regress           | pg_regress and isolation specs                           | regress"
  "fm  | ec  | regress_distributed | pg_regress and isolation specs, distributed mode (idempotency.distributed = on) | regress_distributed"
  "fq  | ec  | python_client     | Python client (pip install, pytest)                      | python_client_tests"
  "fq  | ec  | node_client       | Node client (npm ci, tsc, node --test)                   | node_client_tests"
  "@integration"
  # Its own cluster (it restarts and crashes it on purpose): about 4 minutes on
  # the host, a short run elsewhere.
  "f   | ec  | model             | model checker                                            | tests/model/ci.sh"
  "qm  | ec  | model_short       | model checker (short run)                                | model_short"
  "f   |     | fuzz              | fuzz canonicalizer (${FUZZ_SECONDS:-60} s)               | fuzz"
  "f   | x   | packages15        | Debian packages for PostgreSQL 15 in a clean bookworm chroot | packages_15"
  "f   | x   | pg17              | PostgreSQL 17 in a Debian chroot (scripts/test-matrix.sh 17) | matrix_version 17"
  "f   | x   | pg18              | PostgreSQL 18 in a Debian chroot (scripts/test-matrix.sh 18) | matrix_version 18"
  "f   | x   | major_upgrade     | keys moved 15 -> 17 -> 18 (pg_dump/pg_restore, scripts/test-matrix.sh --major-upgrade) | major_upgrade"
)
trim() { local v=$1; v=${v#"${v%%[![:space:]]*}"}; echo "${v%"${v##*[![:space:]]}"}"; }
# The table with the integration tests in place: "tiers|needs|name|title|command".
rows=()
for row in "${SUITES[@]}"; do
  if [[ $row == @integration ]]; then
    for t in tests/integration/*.sh; do
      [[ -e $t ]] || continue
      name=$(basename "$t" .sh)
      tiers=f
      [[ $quick_integration == *" $name "* ]] && tiers+=q
      [[ $matrix_integration == *" $name "* ]] && tiers+=m
      needs=ec
      [[ $cpp_integration == *" $name "* ]] && needs+=b
      [[ $tier != m && $node_integration == *" $name "* ]] && needs+=n
      rows+=("$tiers|$needs|$name|integration: $name|bash $t")
    done
    continue
  fi
  IFS='|' read -r tiers needs name title command <<<"$row"
  rows+=("$(trim "$tiers")|$(trim "$needs")|$(trim "$name")|$(trim "$title")|$(trim "$command")")
done

last_time() {  # last_time NAME: the last measured seconds, or "-"
  local t
  t=$(awk -F'\t' -v n="$1" '$1 == n { t = $2 } END { print t }' "$times_file" 2>/dev/null)
  [[ -z $t ]] && t=$(awk -F'\t' -v n="$1" '$1 == n { t = $3 " (warm, reference)" } END { print t }' \
    "$reference_times" 2>/dev/null)
  echo "${t:--}"
}
if ((listing)); then
  printf '%-26s %-6s %s\n' suite tiers "last time (s)"
  for row in "${rows[@]}"; do
    IFS='|' read -r tiers needs name title command <<<"$row"
    printf '%-26s %-6s %s\n' "$name" "$tiers" "$(last_time "$name")"
  done
  echo
  echo "tiers: f = scripts/test.sh, q = --quick, m = inside the 17/18 chroots"
  exit 0
fi
if [[ $tier == n ]]; then
  for name in "${chosen[@]}"; do
    found=0
    for row in "${rows[@]}"; do
      IFS='|' read -r tiers needs n title command <<<"$row"
      [[ $n == "$name" ]] && found=1
    done
    if ((!found)); then
      echo "scripts/test.sh: no suite named '$name'; the suites are:" >&2
      for row in "${rows[@]}"; do IFS='|' read -r tiers needs n title command <<<"$row"; echo "  $n" >&2; done
      exit 2
    fi
  done
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
# Every compiler call through ccache (scripts/install-deps.sh installs it): the
# PGXS build finds /usr/lib/ccache's g++ first on PATH, CMake records it as its
# compiler. A run in the same folder as the last (CI's clean clone, the chroots'
# /src) hits its entries; paths stay absolute (no CCACHE_BASEDIR: it rewrites them
# relative to the build folder, and so __FILE__, which tests use to find their
# data); the cache lives in ~/.cache/ccache (inside a matrix chroot: the chroot's,
# which the matrix cache keeps). IDEM_CCACHE=0 turns it off.
if [[ ${IDEM_CCACHE:-1} != 0 && -d /usr/lib/ccache ]]; then
  export PATH=/usr/lib/ccache:$PATH CCACHE_NOHASHDIR=true
fi
# The Rust crate, its tests and its example build into one target folder outside
# the tree (cargo reuses what its fingerprints say is current, so a new clone
# rebuilds our crates only, not their dependencies); CARGO_TARGET_DIR overrides.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/idempotency/cargo-target}
passed=0
failed=0
failures=()
table=()
mkdir -p build
record() {  # record NAME RESULT SECONDS
  table+=("$1|$2|$3")
  printf '%s\t%s\t%s\t%s\n' "$1" "$3" "$2" "$(date -u +%FT%TZ)" >>"$times_file"
}
alone() { [[ $scope == matrix ]] && echo "IDEM_TEST_SCOPE=matrix scripts/test.sh $1" || echo "scripts/test.sh $1"; }
suite() {  # suite NAME TITLE COMMAND...
  local name=$1 title=$2
  shift 2
  echo
  echo "=== $title"
  local start=$SECONDS
  if "$@"; then
    passed=$((passed + 1))
    echo "--- $title: ok ($((SECONDS - start)) s)"
    record "$name" ok $((SECONDS - start))
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "--- $title: FAILED ($((SECONDS - start)) s); alone: $(alone "$name")"
    record "$name" FAILED $((SECONDS - start))
  fi
}

build_extension() { make -s clean >/dev/null 2>&1; make -s -j"$jobs" WERROR=1 && make -s install; }
bench=OFF
[[ $tier == f ]] && bench=ON
# Inside a matrix chroot: the targets its suites use (not proxy-service, nor the
# benchmarks), optimized as on the host (so the newer compiler's warnings that
# need -O2 still stop the build) but without debug information, the most of
# the compile time there.
build_cpp() {
  local flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG") targets=()
  if [[ $scope == matrix ]]; then
    flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG")
    targets=(--target idempotency_client core_tests client_unit_tests client_integration_tests jcs_tool
      orders-service)
  fi
  cmake -S . -B build-test -DIDEM_WERROR=ON -DIDEM_BUILD_BENCH=$bench -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "${flags[@]}" >/dev/null &&
    cmake --build build-test -j"$jobs" "${targets[@]}"
}
run_ctest() { (cd build-test && ctest --output-on-failure -j"$jobs"); }
sanitizer_tests() {
  cmake -S . -B build-asan -DIDEM_WERROR=ON -DIDEM_SANITIZE=ON -DIDEM_BUILD_CLIENT=OFF -DIDEM_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=Debug >/dev/null &&
    cmake --build build-asan -j"$jobs" --target core_tests jcs_tool &&
    (cd build-asan && ctest --output-on-failure -j"$jobs")
}

# The Python package installed the way users install it: the wheel that
# `python -m build` makes, installed with pip into a fresh venv with its
# dependencies from the package index (psycopg's compiled speedups, Django,
# Starlette), every version pinned by client/python/constraints.txt
# (client/python/tools/env.sh); its tests then run against the installed copy and
# start their own cluster. Once with Debian's interpreter and once with the
# machine's python3 when that is another one (--quick: Debian's only). pytest's exit status 5 (no tests
# collected) is a failure like any other.
python_client_tests() {
  local python env status=0 seen="" pythons=(/usr/bin/python3 "$(command -v python3)")
  # --quick: Debian's interpreter only (the whole run has both).
  [[ $tier == q ]] && pythons=(/usr/bin/python3)
  for python in "${pythons[@]}"; do
    [[ -n $python ]] || continue
    python=$("$python" -c 'import sys; print(sys.executable)') || { status=1; continue; }
    [[ " $seen " == *" $python "* ]] && continue
    seen+=" $python"
    echo "# $python ($("$python" -V 2>&1))"
    env=$(client/python/tools/env.sh "$python") || { status=1; continue; }
    (cd client/python/tests &&
       IDEM_EXPECT_INSTALLED=1 IDEM_PYTEST_PORT=$((port + 20)) "$env/bin/python" -m pytest -q -p no:cacheprovider .)
    case $? in
    0) ;;
    5) echo "pytest collected no tests"; status=1 ;;
    *) status=1 ;;
    esac
  done
  return "$status"
}

# The Node package built from its committed lock file (npm ci, whose prepare step
# runs tsc), then its tests (node --test) against a cluster they start themselves.
build_node() {
  (cd client/node && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build)
}
node_client_tests() {
  build_node && have+=n && (cd client/node && IDEM_NODE_TEST_PORT=$((port + 21)) node test/run.js)
}

cluster=$(mktemp -d /tmp/idem-test.XXXXXX)
# Below the kernel's ephemeral range (32768-60999), where an outgoing
# connection's local port could take the port of a cluster or a service that
# a test starts at port + N (seen: "Address already in use" for port + 30),
# and below the fixed ports of other suites (chroots 28000+). The model
# checker's clusters take port + 40 to + 46.
port=${IDEM_TEST_PORT:-$((20000 + RANDOM % 6000))}
stream_pid=""
cleanup() {
  [[ -n $stream_pid ]] && kill -- -"$stream_pid" 2>/dev/null
  scripts/pgcluster.sh stop "$cluster/pg"
  rm -rf "$cluster"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# What a suite needs, made at most once per run: the extension built and
# installed, the C++ build, the cluster. In a tier run the suites "extension" and
# "cpp_build" make the first two; a suite by name gets them as setup steps.
have=""
setup_failed=""
need() {  # need LETTERS: makes what is missing; false when a setup step failed
  local letter
  for letter in $(echo "$1" | grep -o .); do
    [[ $letter == x || $have == *$letter* ]] && continue
    [[ $setup_failed == *$letter* ]] && return 1
    case $letter in
    e) echo "=== setup: extension build and install"; build_extension ;;
    b) echo "=== setup: C++ build"; build_cpp ;;
    n) echo "=== setup: Node client build"; build_node ;;
    c) scripts/pgcluster.sh start "$cluster/pg" "$port" && source "$cluster/pg/env" ;;
    esac
    if (($? == 0)); then have+=$letter; else
      setup_failed+=$letter
      failed=$((failed + 1))
      failures+=("setup $letter")
      record "setup:$letter" FAILED 0
      return 1
    fi
  done
}

regress() { make -s installcheck || { cat regression.diffs output_iso/regression.diffs 2>/dev/null | head -200; return 1; }; }
# The same suite in the distributed mode: every read and write of the key
# table by SQL statements, as under Citus (docs/scale-out.md).
regress_distributed() { PGOPTIONS="-c idempotency.distributed=on" regress; }
model_short() {
  # --quick: one fixed seed, the random one and a short refuse form; no
  # distributed, role or PL/Proxy form (the whole run has them).
  if [[ $tier == q ]]; then
    MODEL_SEEDS="11" MODEL_SECONDS=15 MODEL_DISTRIBUTED_SECONDS=0 MODEL_PROXY_SECONDS=0 \
      MODEL_REFUSE_SECONDS=10 MODEL_ROLES_SECONDS=0 tests/model/ci.sh
  else
    # Inside a 17/18 chroot: every form the host runs (the fixed and the random
    # seed, distributed, refuse, both role clusters, the trusted edition, PL/Proxy),
    # each shorter than on the host (about 140 s in all, from 240): what depends
    # on the server's major version is whether a form holds at all; the long
    # searches are the host's (tests/model/ci.sh defaults) and the refuse form,
    # which found a PG18-only bug, keeps its 20 s.
    MODEL_SEEDS="11" MODEL_SECONDS=15 MODEL_DISTRIBUTED_SECONDS=10 MODEL_REFUSE_SECONDS=20 \
      MODEL_ROLES_SECONDS=10 MODEL_TRUSTED_SECONDS=10 MODEL_PROXY_SECONDS=15 tests/model/ci.sh
  fi
}
fuzz() { scripts/fuzz.sh "${FUZZ_SECONDS:-60}"; }
# The chroot suites copy the tree as it was when the run started (a tar made
# below), not as the host's suites leave it while they run.
matrix_version() { scripts/test-matrix.sh "$1"; }
# The Debian packages of 15, installed into a clean bookworm chroot (17 and 18
# get theirs in their matrix runs), and the keys moved between versions.
packages_15() { IDEM_MATRIX_SUITE=0 scripts/test-matrix.sh 15; }
major_upgrade() { scripts/test-matrix.sh --major-upgrade; }
with_matrix() { [[ -n ${IDEM_MATRIX-17 18} ]]; }
in_matrix() { [[ " ${IDEM_MATRIX-17 18} " == *" $1 "* ]]; }

# The rows this run takes, in order.
selected=()
for row in "${rows[@]}"; do
  IFS='|' read -r tiers needs name title command <<<"$row"
  if [[ $tier == n ]]; then
    [[ " ${chosen[*]} " == *" $name "* ]] || continue
  else
    [[ $tiers == *$tier* ]] || continue
    if [[ $needs == *x* ]]; then
      with_matrix || continue
      [[ $name == pg1[0-9] ]] && ! in_matrix "${name#pg}" && continue
      [[ $name == major_upgrade ]] && ! { in_matrix 17 && in_matrix 18; } && continue
    fi
  fi
  selected+=("$row")
done

# The chroot suites of a tier run go in a background stream, one after the
# other, each to a log of its own; the host's suites run meanwhile, and the
# stream's logs and results are printed at the end. Most of a chroot suite's
# time is waiting (apt, debootstrap, the tests' own sleeps), which the host's
# CPU-bound suites fill.
stream_dir=$cluster/stream
if [[ $tier == f && ${IDEM_TEST_SERIAL:-0} != 1 ]]; then
  stream=()
  for row in "${selected[@]}"; do
    IFS='|' read -r tiers needs name title command <<<"$row"
    [[ $needs == *x* ]] && stream+=("$row")
  done
  if ((${#stream[@]})); then
    mkdir -p "$stream_dir"
    git ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
      tar --null -T - -cf "$stream_dir/tree.tar"
    export IDEM_MATRIX_TREE=$stream_dir/tree.tar
    echo "=== chroot suites in the background: $(for r in "${stream[@]}"; do IFS='|' read -r _ _ n _ _ <<<"$r"; printf '%s ' "$n"; done)"
    set -m
    (
      for row in "${stream[@]}"; do
        IFS='|' read -r tiers needs name title command <<<"$row"
        start=$SECONDS
        # shellcheck disable=SC2086 # the command is words from the table
        if $command >"$stream_dir/$name.log" 2>&1; then result=ok; else result=FAILED; fi
        printf '%s|%s|%s|%s\n' "$name" "$result" "$((SECONDS - start))" "$title" >>"$stream_dir/results"
      done
    ) &
    stream_pid=$!
    set +m
  fi
fi

for row in "${selected[@]}"; do
  IFS='|' read -r tiers needs name title command <<<"$row"
  [[ -n $stream_pid && $needs == *x* ]] && continue
  if ! need "$needs"; then
    failed=$((failed + 1))
    failures+=("$name")
    echo "--- $title: FAILED (a setup step failed); alone: $(alone "$name")"
    record "$name" FAILED 0
    continue
  fi
  # shellcheck disable=SC2086 # the command is words from the table
  suite "$name" "$title" $command
  [[ $name == extension && ${table[-1]} == *"|ok|"* ]] && have+=e
  [[ $name == cpp_build && ${table[-1]} == *"|ok|"* ]] && have+=b
done
# The run's cluster is stopped before the stream's results are read: what
# still runs there has its own.
scripts/pgcluster.sh stop "$cluster/pg" >/dev/null 2>&1

if [[ -n $stream_pid ]]; then
  echo
  echo "=== waiting for the chroot suites"
  wait "$stream_pid"
  stream_pid=""
  for row in "${stream[@]}"; do
    IFS='|' read -r tiers needs name title command <<<"$row"
    line=$(grep -F "$name|" "$stream_dir/results" 2>/dev/null | head -1)
    IFS='|' read -r _ result seconds _ <<<"$line"
    echo
    echo "=== $title (in the background)"
    cat "$stream_dir/$name.log" 2>/dev/null
    if [[ $result == ok ]]; then
      passed=$((passed + 1))
      echo "--- $title: ok ($seconds s)"
    else
      failed=$((failed + 1))
      failures+=("$name")
      echo "--- $title: FAILED (${seconds:-?} s); alone: $(alone "$name")"
    fi
    record "$name" "${result:-FAILED}" "${seconds:-0}"
  done
fi

echo
printf '%-26s %-7s %s\n' suite result seconds
for line in "${table[@]}"; do
  IFS='|' read -r name result seconds <<<"$line"
  printf '%-26s %-7s %s\n' "$name" "$result" "$seconds"
done
printf '%-26s %-7s %s\n' "(the whole run)" "" "$SECONDS"
echo
for f in "${failures[@]}"; do echo "failed suite: $f (alone: $(alone "$f"))"; done
echo "$passed passed, $failed failed"
((failed == 0))
