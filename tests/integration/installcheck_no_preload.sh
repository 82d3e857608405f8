#!/usr/bin/env bash
# `make installcheck` (pg_regress and isolation specs) on a server that does
# NOT preload the library (shared_preload_libraries = 'pg_cron' only), as a
# user checks a new install: a second throwaway cluster. The counters' tests
# then match their alternative outputs (expected/counters_1.out says "NOT RUN";
# security_search_path_1.out and counters_across_backends_1.out show the
# counters off). Port: PGPORT + 32 of the cluster of scripts/test.sh
# (IDEM_INSTALLCHECK_PORT overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d /tmp/idem-installcheck.XXXXXX)
trap 'scripts/pgcluster.sh stop "$dir/pg" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
PGCLUSTER_PRELOAD=pg_cron scripts/pgcluster.sh start "$dir/pg" \
  "${IDEM_INSTALLCHECK_PORT:-$((${PGPORT:-54329} + 32))}"
# shellcheck disable=SC1091
source "$dir/pg/env"
[[ $(psql -X -At -c "SHOW shared_preload_libraries") == pg_cron ]] || { echo "FAIL: library preloaded"; exit 1; }
make -s installcheck || {
  cat regression.diffs output_iso/regression.diffs 2>/dev/null | head -200
  exit 1
}
