#!/usr/bin/env bash
# Server instructions per call on each path of a keyed request, two builds of
# the extension side by side in one run (issue 35 item 7: begin + complete
# within 3 % of 0.8.0). callgrind counts what a single-user backend executes
# for N and 2N calls; (2N - N) / N is one call's cost, startup cancelled out.
# Exact and independent of other load on the machine. Paths:
#   begin + complete  a fresh key started and stored in one statement
#   replay            begin of a stored key (the answer a retry gets)
#   mismatch          begin of a stored key with another fingerprint (422)
#   + http_answer     replay with idempotency.http_answer (0.9.0 only)
# Each build is installed into a private copy of PostgreSQL 15 (bench/lib.sh
# private_root), the library preloaded (counters on) in both.
#
#   bench/protocol/instructions.sh [BEFORE_REF]   (default b3b9898^: the 0.8.0 release)
#   INSTR_N=2000 INSTR_ROOTS=/tmp/idem-instructions
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/bench/lib.sh"
before=${1:-b3b9898^}
n=${INSTR_N:-2000}
roots=${INSTR_ROOTS:-/tmp/idem-instructions}
command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind" >&2; exit 1; }

as_postgres() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
mkdir -p "$roots"
rm -rf "$roots/src-before"
git -C "$root" worktree add -q --detach "$roots/src-before" "$before"
trap 'git -C "$root" worktree remove --force "$roots/src-before" 2>/dev/null || true' EXIT
private_root "$roots/before" "$roots/src-before"
private_root "$roots/after" "$root"

fp="'\\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea"
other="'\\xff112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea"
run=0
# statement BUILD PATH COUNT: the statement that makes COUNT calls on PATH.
statement() {
  run=$((run + 1))
  case $2 in
  fresh) echo "SELECT count(*) FROM generate_series(1, $3) g,
             LATERAL idempotency.begin('p', 'r${run}_' || g, 'act', $fp) b,
             LATERAL idempotency.complete('p', 'r${run}_' || g, status => 201) c
           WHERE b.outcome = 'started' AND c;" ;;
  replay) echo "SELECT count(*) FROM generate_series(1, $3) g,
             LATERAL idempotency.begin('p', 'k' || (g * 0), 'act', $fp) b WHERE b.outcome = 'replay';" ;;
  mismatch) echo "SELECT count(*) FROM generate_series(1, $3) g,
             LATERAL idempotency.begin('p', 'k' || (g * 0), 'act', $other) b WHERE b.outcome = 'mismatch';" ;;
  answer) echo "SELECT count(*) FROM generate_series(1, $3) g,
             LATERAL idempotency.begin('p', 'k' || (g * 0), 'act', $fp) b,
             LATERAL idempotency.http_answer(b) a WHERE a.status = 201;" ;;
  esac
}
# instructions BUILD PATH COUNT: what the backend executed for COUNT calls.
instructions() {
  local bin=$roots/$1/usr/lib/postgresql/15/bin
  statement "$1" "$2" "$3" | tr '\n' ' ' | sed 's/$/\n/' |
    as_postgres valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin/postgres" --single \
      -D "$roots/$1/data" -c shared_preload_libraries=idempotency postgres 2>&1 >/dev/null |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
declare -A per_call
for build in before after; do
  bin=$roots/$build/usr/lib/postgresql/15/bin
  mkdir -p "$roots/$build/data"
  [[ $(id -u) -eq 0 ]] && chown postgres "$roots/$build/data"
  as_postgres "$bin/initdb" -D "$roots/$build/data" -U postgres -A trust >/dev/null
  printf '%s\n' "CREATE EXTENSION idempotency;" "BEGIN;" \
    "SELECT idempotency.begin('p', 'k0', 'act', $fp);" \
    "SELECT idempotency.complete('p', 'k0', status => 201, body => 'stored body'::bytea);" "COMMIT;" |
    as_postgres "$bin/postgres" --single -D "$roots/$build/data" postgres >"$roots/$build/setup.log" 2>&1 ||
    { cat "$roots/$build/setup.log"; exit 1; }
  echo "$build: $(as_postgres "$bin/postgres" --single -D "$roots/$build/data" postgres <<<"SELECT extversion FROM pg_extension WHERE extname = 'idempotency';" 2>/dev/null | sed -n 's/.*extversion = "\([^"]*\)".*/\1/p')"
  paths="fresh replay mismatch"
  [[ $build == after ]] && paths+=" answer"
  for path in $paths; do
    one=$(instructions "$build" "$path" "$n")
    two=$(instructions "$build" "$path" $((2 * n)))
    [[ -n $one && -n $two ]] || { echo "instructions.sh: no count for $build $path" >&2; exit 1; }
    per_call[$build.$path]=$(((two - one) / n))
  done
done
echo
echo "instructions per call (callgrind, N = $n; before = $before, after = the work tree)"
printf '%-20s %12s %12s %8s\n' path before after ratio
for path in fresh replay mismatch answer; do
  b=${per_call[before.$path]:-} a=${per_call[after.$path]}
  label=$path
  [[ $path == fresh ]] && label="begin + complete"
  [[ $path == answer ]] && label="replay + http_answer"
  if [[ -n $b ]]; then
    printf '%-20s %12s %12s %8s\n' "$label" "$b" "$a" "$(echo "scale=3; $a / $b" | bc)"
  else
    printf '%-20s %12s %12s %8s\n' "$label" "-" "$a" "-"
  fi
done
