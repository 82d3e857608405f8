#!/usr/bin/env bash
# The canonical JSON and fingerprint benchmarks in one command:
#
#   bench/run-jcs.sh
#
# 1. installs the npm peers into bench/node_modules if they are missing
#    (npm install --no-package-lock: no lockfile is written),
# 2. generates the deterministic corpora into bench/corpus/,
# 3. builds jcs_bench (CMake Release build in build-bench/, or g++ -O3 when the
#    jcs_bench target is not available),
# 4. runs jcs_bench and node_bench.js and prints the throughput table,
# 5. runs bench/sql/fingerprint_bench.sh (skip with SKIP_SQL=1).
#
# Environment: BENCH_SECONDS (time per contender and corpus, default 1.5),
# BENCH_BUILD_DIR (default <repo>/build-bench), SKIP_SQL=1.
# Results (JSON lines and the Markdown table) are left in bench/results/.
# Timings are printed, never asserted.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
seconds=${BENCH_SECONDS:-1.5}
build=${BENCH_BUILD_DIR:-$root/build-bench}
corpus=$here/corpus
results=$here/results
files=("$corpus/api-1k.jsonl" "$corpus/api-64k.jsonl" "$corpus/api-4m.jsonl")

step() { printf '\n== %s\n' "$*"; }

step "machine"
echo "cores: $(nproc); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "node $(node --version); $(${CXX:-g++} --version | head -1)"

step "npm peers"
if [[ ! -f $here/node_modules/json-canon/package.json || ! -f $here/node_modules/canonicalize/package.json ]]; then
  (cd "$here" && npm install --no-package-lock --no-audit --no-fund --loglevel=error)
fi
echo "json-canon and canonicalize installed in $here/node_modules"

step "corpora"
node "$here/jcs/gen_corpus.js" "$corpus"

step "build jcs_bench"
mkdir -p "$results"
bench_bin=
if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DIDEM_BUILD_BENCH=ON >"$results/cmake.log" 2>&1 \
   && cmake --build "$build" --target jcs_bench -j "$(nproc)" >>"$results/cmake.log" 2>&1; then
  bench_bin=$(find "$build" -type f -name jcs_bench -perm -u+x | head -1)
fi
if [[ -n $bench_bin ]]; then
  echo "CMake Release build: $bench_bin"
  rm -f "$results/cmake.log"
else
  echo "no jcs_bench target in the CMake build (see $results/cmake.log); building with ${CXX:-g++} -O3"
  mkdir -p "$here/build"
  bench_bin=$here/build/jcs_bench
  ${CXX:-g++} -std=c++17 -O3 -DNDEBUG -I"$root/src/core" "$root"/src/core/jcs*.cpp "$root/src/core/fingerprint.cpp" \
    "$here/jcs/jcs_bench.cpp" -lcrypto -o "$bench_bin"
fi

step "ours (C++)"
"$bench_bin" --seconds "$seconds" --emit "$corpus" "${files[@]}" | tee "$results/ours.jsonl"

step "node: JSON.parse, json-canon, canonicalize"
node "$here/jcs/node_bench.js" --seconds "$seconds" "${files[@]}" | tee "$results/node.jsonl"

rm -f "$results/sql.jsonl" "$results/sql.txt"
if [[ ${SKIP_SQL:-0} != 1 ]]; then
  step "SQL: fingerprint vs sha256"
  "$here/sql/fingerprint_bench.sh" "$corpus/api-1k.jsonl" | tee "$results/sql.txt"
  grep '^{' "$results/sql.txt" >"$results/sql.jsonl"
fi

step "summary"
node "$here/jcs/report.js" "$results"/*.jsonl | tee "$results/table.md"
