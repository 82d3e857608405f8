#!/usr/bin/env bash
# The cost of the counters of idempotency.stats, in instructions (exact, not
# disturbed by other load): callgrind counts what a single-user backend
# executes for N and 2N calls of idempotency.begin() that replay a stored key,
# with the library preloaded (counters on) and not (off); the difference
# between 2N and N, divided by N, is the cost of one call (startup cancels
# out). Needs valgrind and the extension installed in the server of PGBIN.
#
#   bench/counters/run.sh            # N = 10000 (COUNTERS_N), 1-3 min
set -euo pipefail
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
n=${COUNTERS_N:-10000}
dir=$(mktemp -d /tmp/idem-counters-bench.XXXXXX)
trap 'rm -rf "$dir"' EXIT
as_postgres() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[[ $(id -u) -eq 0 ]] && chown postgres "$dir" && chmod o+x "$(dirname "$dir")"
as_postgres "$PGBIN/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
fp="'\\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea"
single() { as_postgres "$PGBIN/postgres" --single -D "$dir/data" -c "shared_preload_libraries=$1" postgres; }
printf '%s\n' "CREATE EXTENSION idempotency;" "BEGIN;" \
  "SELECT idempotency.begin('p', 'k0', 'act', $fp);" "SELECT idempotency.complete('p', 'k0', status => 201);" \
  "COMMIT;" | single "" >"$dir/setup.log" 2>&1 || { cat "$dir/setup.log"; exit 1; }
calls() {  # preload count -> instructions
  echo "SELECT count(*) FROM generate_series(1, $2) g, LATERAL idempotency.begin('p', 'k' || (g * 0), 'act', $fp) b WHERE b.outcome = 'replay';" |
    as_postgres valgrind --tool=callgrind --callgrind-out-file=/dev/null "$PGBIN/postgres" --single -D "$dir/data" \
      -c "shared_preload_libraries=$1" postgres 2>&1 >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
for mode in on off; do
  preload=$([[ $mode == on ]] && echo idempotency || echo "")
  one=$(calls "$preload" "$n")
  two=$(calls "$preload" $((2 * n)))
  echo "counters $mode: $(( (two - one) / n )) instructions per begin() (replay)"
done
