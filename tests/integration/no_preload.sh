#!/usr/bin/env bash
# The extension in a server that does NOT preload it (shared_preload_libraries
# = 'pg_cron' only): a second, small throwaway cluster, where
# `make installcheck-nopreload` runs tests/no_preload (settings set before the
# library loads; idempotency.stats saying the counters are off, with a HINT,
# and every function working without them), then tests/pgtap/06_citus_placement.sql
# (the refusals under Citus's placement), then idempotency.routed from a startup
# option for a role with only the schema's USAGE. Port: PGPORT + 30 of the cluster
# of scripts/test.sh (IDEM_NOPRELOAD_PORT overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d /tmp/idem-nopreload.XXXXXX)
trap 'scripts/pgcluster.sh stop "$dir/pg" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
PGCLUSTER_PRELOAD=pg_cron scripts/pgcluster.sh start "$dir/pg" "${IDEM_NOPRELOAD_PORT:-$((${PGPORT:-54329} + 30))}"
# shellcheck disable=SC1091
source "$dir/pg/env"
[[ $(psql -X -At -c "SHOW shared_preload_libraries") == pg_cron ]] || { echo "FAIL: library preloaded"; exit 1; }
make -s installcheck-nopreload || { cat output_nopreload/regression.diffs 2>/dev/null | head -200; exit 1; }
# The refusals under Citus's placement (stand-in catalogs) without the library preloaded:
# the pgTAP file of the preloaded suite, in a database of this cluster.
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE idem_nopreload_tap"
psql -X -q -v ON_ERROR_STOP=1 -d idem_nopreload_tap -c "CREATE EXTENSION pgtap" \
  -c "CREATE EXTENSION idempotency"
pg_prove -d idem_nopreload_tap tests/pgtap/06_citus_placement.sql
# idempotency.routed from a startup option (as the routers send it), set before the library
# loads, by a role with nothing but the schema's USAGE: on once the library loads; a value
# that is not a boolean falls back to off with a WARNING (docs/sql-reference.md, Settings).
psql -X -q -v ON_ERROR_STOP=1 -d idem_nopreload_tap -c "CREATE ROLE idem_routed_role LOGIN" \
  -c "GRANT USAGE ON SCHEMA idempotency TO idem_routed_role"
routed_after_load() {
  PGOPTIONS="-c idempotency.routed=$1" psql -X -At -v ON_ERROR_STOP=1 -U idem_routed_role \
    -d idem_nopreload_tap -c "SELECT idempotency.jcs('{}')" -c "SHOW idempotency.routed" 2>&1
}
out=$(routed_after_load on)
[[ $(tail -1 <<<"$out") == on ]] || { echo "FAIL: idempotency.routed=on from a startup option: $out"; exit 1; }
out=$(routed_after_load maybe)
[[ $(tail -1 <<<"$out") == off && $out == *'requires a Boolean value'* ]] ||
  { echo "FAIL: idempotency.routed=maybe did not fall back to off with a warning: $out"; exit 1; }
psql -X -q -d idem_nopreload_tap -c "DROP OWNED BY idem_routed_role" -c "DROP ROLE idem_routed_role"
echo "ok - idempotency.routed from a startup option without preload: on; not a boolean: off"
