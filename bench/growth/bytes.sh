#!/usr/bin/env bash
# Stored bytes per key, as a user's traffic leaves them: pgbench runs the keyed
# write (bench/protocol/extension.sql: begin, an effect, complete with a 27-byte
# JSON body), every request its own transaction and its own time, at each rate
# of RATES; then VACUUM and the size of the heap and of each index of
# idempotency.keys divided by the rows. The index of 0.7.0 (a B-tree on
# expires_at) is kept beside the one cleanup walks since 0.8.0 (on expires_at cut
# to 10 ms), both filled by the same inserts, so one run prints both layouts and
# their ratio. See bench/growth/README.md.
#
#   bench/growth/bytes.sh                       RATES="max 1000 100"
#   RATES=max KEYS_AT_MAX=50000 bench/growth/bytes.sh           a quick check
#
# Environment: RATES (max = as fast as 4 clients go; a number = requests per
# second, pgbench -R), KEYS_AT_MAX (200000 requests at max), SECONDS_AT_RATE (100 s
# at a fixed rate), TENANTS (1000), CLIENTS (4), PGBIN, BYTES_DIR (/tmp/bytes-bench),
# BYTES_PORT (27820).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
read -r -a rates <<<"${RATES:-max 1000 100}"
keys_at_max=${KEYS_AT_MAX:-200000} seconds_at_rate=${SECONDS_AT_RATE:-100}
tenants=${TENANTS:-1000} clients=${CLIENTS:-4}
dir=${BYTES_DIR:-/tmp/bytes-bench} port=${BYTES_PORT:-27820}
export PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
for rate in "${rates[@]}"; do
  [[ $rate == max || $rate =~ ^[1-9][0-9]*$ ]] || { echo "RATES: max or a number, not $rate" >&2; exit 2; }
done

stop() { "$root/scripts/pgcluster.sh" stop "$dir" >/dev/null 2>&1 || true; }
trap stop EXIT
stop
PGCLUSTER_CONF="synchronous_commit = off
autovacuum = off" "$root/scripts/pgcluster.sh" start "$dir" "$port" >/dev/null
# shellcheck disable=SC1091
source "$dir/env"
export PGDATABASE=bytes
sql() { "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
sql -d postgres -c "CREATE DATABASE bytes"
sql -c "CREATE EXTENSION idempotency" -f "$root/bench/protocol/setup.sql"
# 0.7.0's index, beside 0.8.0's: the same inserts fill both.
sql -c "CREATE INDEX keys_expires_at_070 ON idempotency.keys (expires_at)"
sql -c "SELECT 1 FROM pg_indexes WHERE indexname = 'keys_expiry_bucket_idx'" | grep -q 1 \
  || { echo "!! keys_expiry_bucket_idx not found: is the installed extension 0.8.0?" >&2; exit 1; }
script=$(mktemp)
trap 'stop; rm -f "$script"' EXIT
{ echo "\\set t random(0, $((tenants - 1)))"; sed "s/'acme'/('tenant_' || :t::int)/" \
  "$root/bench/protocol/extension.sql"; } >"$script"

# Candidate layouts, not shipped, weighed on the rows of the first rate: the
# same rows copied into tables that differ in one way each from a copy of
# idempotency.keys as it is (copies are packed: no space left by the protocol's
# own updates, so the candidates are compared with the copy, not the table),
# each with the key table's primary key and expiry index (see README.md).
copy_layouts() {
  sql <<'SQL'
CREATE TABLE bench.keys_same (LIKE idempotency.keys INCLUDING DEFAULTS);
CREATE TABLE bench.keys_char (LIKE idempotency.keys INCLUDING DEFAULTS);
ALTER TABLE bench.keys_char ALTER COLUMN state TYPE "char" USING left(state, 1)::"char";
-- Fixed-width columns first (no alignment padding between them), state as "char".
CREATE TABLE bench.keys_packed (
    fence bigint NOT NULL, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
    lease_until timestamptz, response_status smallint, one_time_secret boolean NOT NULL,
    state "char" NOT NULL, principal text NOT NULL, key text NOT NULL, action text NOT NULL,
    request_sha256 bytea NOT NULL, response_headers jsonb, response_body bytea, resource_id text);
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['bench.keys_same', 'bench.keys_char', 'bench.keys_packed'] LOOP
        EXECUTE format('ALTER TABLE %s ADD PRIMARY KEY (principal, key)', t);
        EXECUTE format('CREATE INDEX ON %s (date_bin(''10 ms'', expires_at, ''2000-01-01+00''))', t);
    END LOOP;
END
$$;
INSERT INTO bench.keys_same SELECT * FROM idempotency.keys;
INSERT INTO bench.keys_char SELECT principal, key, action, request_sha256, left(state, 1)::"char",
       response_status, response_headers, response_body, resource_id, one_time_secret, fence,
       lease_until, created_at, expires_at FROM idempotency.keys;
INSERT INTO bench.keys_packed SELECT fence, created_at, expires_at, lease_until, response_status,
       one_time_secret, left(state, 1)::"char", principal, key, action, request_sha256,
       response_headers, response_body, resource_id FROM idempotency.keys;
VACUUM ANALYZE bench.keys_same, bench.keys_char, bench.keys_packed;
SQL
}
report_layouts() {
  echo
  printf '%s\n' "layout (rows of rate ${rates[0]}, copied)	heap	primary key	expiry index	total	/ 0.8.0 copied"
  sql -F $'\t' <<'SQL'
WITH l(ord, name, rel) AS (VALUES (1, '0.8.0', 'bench.keys_same'::regclass),
                                  (2, 'state as "char"', 'bench.keys_char'::regclass),
                                  (3, '"char", fixed-width columns first', 'bench.keys_packed'::regclass)),
s AS (SELECT l.ord, l.name, (SELECT count(*) FROM bench.keys_same)::numeric AS rows, pg_relation_size(l.rel) AS heap,
             (SELECT pg_relation_size(i.indexrelid) FROM pg_index AS i WHERE i.indrelid = l.rel AND i.indisprimary) AS pkey,
             (SELECT pg_relation_size(i.indexrelid) FROM pg_index AS i WHERE i.indrelid = l.rel AND NOT i.indisprimary) AS expiry
        FROM l)
SELECT name, round(heap / rows, 1), round(pkey / rows, 1), round(expiry / rows, 1),
       round((heap + pkey + expiry) / rows, 1),
       round((heap + pkey + expiry)::numeric / first_value(heap + pkey + expiry) OVER (ORDER BY ord), 3)
  FROM s ORDER BY ord;
SQL
}

echo "source: $(git -C "$root" rev-parse --short HEAD) (PGBIN $PGBIN); $(sql -c 'SHOW server_version')"
printf '%s\n' "rate (requests/s)	keys	heap	primary key	expires_at (0.7.0)	expiry bucket (0.8.0)	0.7.0 total	0.8.0 total	0.8.0 / 0.7.0"
for rate in "${rates[@]}"; do
  sql -c "TRUNCATE idempotency.keys, bench.effects"
  if [[ $rate == max ]]; then
    args=(-t $((keys_at_max / clients)))
  else
    args=(-R "$rate" -T "$seconds_at_rate")
  fi
  out=$("$PGBIN/pgbench" -n -M prepared -c "$clients" -j 2 "${args[@]}" -f "$script" 2>&1) \
    || { echo "$out" >&2; exit 1; }
  [[ $(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$out") == 0 ]] \
    || { echo "$out" >&2; echo "!! failed transactions" >&2; exit 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out" | head -1)
  sql -c "VACUUM ANALYZE idempotency.keys"
  sql -F $'\t' -c "
    WITH n AS (SELECT count(*)::numeric AS rows FROM idempotency.keys),
    s AS (SELECT pg_relation_size('idempotency.keys') AS heap,
                 pg_relation_size('idempotency.keys_pkey') AS pkey,
                 pg_relation_size('idempotency.keys_expires_at_070') AS old,
                 pg_relation_size('idempotency.keys_expiry_bucket_idx') AS bucket)
    SELECT '$rate (' || round($tps) || ')', n.rows, round(heap / rows, 1), round(pkey / rows, 1),
           round(old / rows, 1), round(bucket / rows, 1),
           round((heap + pkey + old) / rows, 1), round((heap + pkey + bucket) / rows, 1),
           round((heap + pkey + bucket)::numeric / (heap + pkey + old), 3)
      FROM n, s"
  [[ $rate != "${rates[0]}" ]] || copy_layouts
done
report_layouts

