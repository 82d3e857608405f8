#!/usr/bin/env bash
# Two builds of the extension side by side, back to back in one command: the
# SQL fingerprint benchmark and the transactional protocol benchmark for each.
#
#   bench/compare-builds.sh BEFORE_REF [AFTER_REF]     (AFTER_REF: the work tree)
#
# Each build gets a private copy of the PostgreSQL 15 installation under
# COMPARE_ROOTS (default /tmp/idem-compare): PostgreSQL finds its share and lib
# folders relative to its binaries, so a copy of /usr/lib/postgresql/15 and
# /usr/share/postgresql/15 is a second, independent installation; the
# extension of BEFORE_REF (a git worktree of that commit) is installed into
# one, the work tree's into the other. Then, for each build in turn:
#   bench/sql/fingerprint_bench.sh        (ROUNDS, default 7)
#   bench/protocol/run.sh                 (PROTO_ROUNDS, default 6; SETTINGS, default "off")
# and a summary of the figures that matter for a before/after: fingerprint /
# sha256, and the protocol's server CPU per transaction for extension, ideal
# and the PL/pgSQL peer. Timings are printed, never asserted.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
before=${1:?usage: bench/compare-builds.sh BEFORE_REF [AFTER_REF]}
after=${2:-}
roots=${COMPARE_ROOTS:-/tmp/idem-compare}
pgver=${PGVER:-15}

source "$here/lib.sh"
make_root() { private_root "$roots/$1" "$2" "$pgver"; }  # NAME SOURCE_DIR

checkout() {  # REF DIR
  rm -rf "$2"
  git -C "$root" worktree add -q --detach "$2" "$1"
}

mkdir -p "$roots"
checkout "$before" "$roots/src-before"
trap 'git -C "$root" worktree remove --force "$roots/src-before" 2>/dev/null || true;
      [[ -n $after ]] && git -C "$root" worktree remove --force "$roots/src-after" 2>/dev/null || true' EXIT
make_root before "$roots/src-before"
if [[ -n $after ]]; then
  checkout "$after" "$roots/src-after"
  make_root after "$roots/src-after"
else
  make_root after "$root"
fi

for build in before after; do
  bin=$roots/$build/usr/lib/postgresql/$pgver/bin
  echo "=== fingerprint benchmark: $build"
  PATH=$bin:$PATH PGBIN=$bin ROUNDS=${ROUNDS:-7} bash "$root/bench/sql/fingerprint_bench.sh" | tee "$roots/fp-$build.txt"
done
for build in before after; do
  bin=$roots/$build/usr/lib/postgresql/$pgver/bin
  echo "=== protocol benchmark: $build"
  PATH=$bin:$PATH PGBIN=$bin PROTO_PGDIR=/tmp/protobench-$build ROUNDS=${PROTO_ROUNDS:-6} \
    SETTINGS=${SETTINGS:-off} RESULTS=$roots/protocol-$build bash "$root/bench/protocol/run.sh" | tail -45
done

echo
echo "=== summary"
for build in before after; do
  ratio=$(grep -o '"ratio":[0-9.]*' "$roots/fp-$build.txt" | cut -d: -f2)
  cpu=$(awk -F'|' '/^Server CPU/ {on = 1} on && /^$/ && seen {exit}
                   on && $2 ~ /^ (ideal|extension|plpgsql) $/ {seen = 1; gsub(/ /, "", $2); gsub(/ *\(.*/, "", $3);
                                                              printf "%s%s us  ", $2, $3}' "$roots/protocol-$build/summary.md")
  echo "$build: fingerprint/sha256 $ratio; server CPU per transaction: $cpu"
done
