#!/usr/bin/env bash
# Builds the libFuzzer target for the canonicalizer and runs it for N seconds
# (default 60) on a copy of tests/fuzz/corpus. Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
out=build-fuzz
mkdir -p "$out"
clang++-14 -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Isrc/core tests/fuzz/jcs_fuzz.cpp src/core/jcs.cpp src/core/jcs_pointers.cpp src/core/jcs_decimal.cpp src/core/fingerprint.cpp -lcrypto -o "$out/jcs_fuzz"
rm -rf "$out/corpus" "$out/artifacts" && mkdir -p "$out/corpus" "$out/artifacts"
cp tests/fuzz/corpus/* "$out/corpus/"
"$out/jcs_fuzz" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$out/artifacts/" -print_final_stats=1 "$out/corpus" 2>"$out/fuzz.log" || {
  tail -40 "$out/fuzz.log"; echo "fuzz: FAILED (artifacts in $out/artifacts)"; exit 1; }
grep -E "stat::number_of_executed_units|cov:" "$out/fuzz.log" | tail -2
echo "fuzz: no finding in $seconds s"
