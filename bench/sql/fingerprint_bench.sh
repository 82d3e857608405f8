#!/usr/bin/env bash
# SQL-level cost of idempotency.fingerprint on 1 KiB JSON bodies, against the
# built-in sha256() of the same raw bytes.
#
#   bench/sql/fingerprint_bench.sh [CORPUS_1K.jsonl]     (default: bench/corpus/api-1k.jsonl)
#
# Starts a throwaway cluster (scripts/pgcluster.sh; BENCH_PGDIR, default
# /tmp/benchpg-$$, and BENCH_PGPORT, default 55440), loads ROWS (default 20000)
# bodies as bytea, checks once that fingerprint really canonicalized them (it
# falls back to hashing raw bytes for non-JSON), then times in one session,
# interleaved, ROUNDS (default 7) rounds of
#   scan         SELECT sum(length(b)) FROM bodies
#   sha256       SELECT sum(length(sha256(b))) FROM bodies
#   fingerprint  SELECT sum(length(idempotency.fingerprint('POST','/orders',b))) FROM bodies
#   fp_noset     the same C function declared without the SET search_path clause
#                (diagnostic only: shows what that clause costs per call)
# after one untimed warm-up round. Times are server-side clock_timestamp() deltas
# around each statement. Prints medians in microseconds per row and the ratio
# fingerprint/sha256 (goal: at most 3), and one JSON line for run-jcs.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
corpus=${1:-$here/../corpus/api-1k.jsonl}
rows=${ROWS:-20000}
rounds=${ROUNDS:-7}
pgdir=${BENCH_PGDIR:-/tmp/benchpg-$$}
pgport=${BENCH_PGPORT:-55440}

[[ -f $corpus ]] || { echo "fingerprint_bench: corpus $corpus not found (run bench/jcs/gen_corpus.js)" >&2; exit 2; }
corpus=$(cd "$(dirname "$corpus")" && pwd)/$(basename "$corpus")

cleanup() { "$root/scripts/pgcluster.sh" stop "$pgdir" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$root/scripts/pgcluster.sh" start "$pgdir" "$pgport" >/dev/null
# shellcheck disable=SC1091
source "$pgdir/env"

psql_() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }

psql_ <<SQL
CREATE EXTENSION idempotency;
SET max_parallel_workers_per_gather = 0;
CREATE TABLE raw_docs (n serial, line text);
-- CSV with a quote and a delimiter that never occur in the corpus: one line, one value.
\copy raw_docs(line) FROM '$corpus' WITH (FORMAT csv, QUOTE E'\x01', DELIMITER E'\x02')
CREATE TABLE bodies AS
  SELECT convert_to(line, 'UTF8') AS b
  FROM generate_series(1, ceil($rows / (SELECT count(*) FROM raw_docs)::numeric)::int) AS r, raw_docs
  ORDER BY r, n LIMIT $rows;
VACUUM ANALYZE bodies;
-- The same C function without "SET search_path" (diagnostic).
CREATE FUNCTION public.fp_noset(text, text, bytea DEFAULT NULL, text[] DEFAULT NULL) RETURNS bytea
  AS '\$libdir/idempotency', 'idempotency_fingerprint' LANGUAGE C IMMUTABLE PARALLEL SAFE;
SQL

# Every body must be canonicalized (not hashed raw): compare with sha256 over jcs().
bad=$(psql_ -At <<'SQL'
SELECT count(*) FROM bodies
WHERE idempotency.fingerprint('POST', '/orders', b)
   <> sha256(convert_to(E'POST\n/orders\n', 'UTF8') || convert_to(idempotency.jcs(convert_from(b, 'UTF8')), 'UTF8'))
   OR idempotency.fingerprint('POST', '/orders', b) = sha256(convert_to(E'POST\n/orders\n', 'UTF8') || b);
SQL
)
if [[ $bad != 0 ]]; then
  echo "fingerprint_bench: WARNING: $bad bodies were not fingerprinted as canonical JSON" >&2
fi

psql_ -At -F ' ' <<SQL >"$pgdir/result.txt"
SET max_parallel_workers_per_gather = 0;
SET jit = off;
CREATE TEMP TABLE timings (round int, what text, ms float8);
DO \$\$
DECLARE
  queries text[][] := ARRAY[
    ARRAY['scan',        'SELECT sum(length(b)) FROM bodies'],
    ARRAY['sha256',      'SELECT sum(length(sha256(b))) FROM bodies'],
    ARRAY['fingerprint', 'SELECT sum(length(idempotency.fingerprint(''POST'', ''/orders'', b))) FROM bodies'],
    ARRAY['fp_noset',    'SELECT sum(length(public.fp_noset(''POST'', ''/orders'', b))) FROM bodies']];
  n int := array_length(queries, 1);
  t0 timestamptz;
  v bigint;
  q int;
BEGIN
  FOR r IN 0..$rounds LOOP          -- round 0 is the warm-up
    FOR k IN 0..n - 1 LOOP
      q := (k + r) % n + 1;         -- rotate the order from round to round
      t0 := clock_timestamp();
      EXECUTE queries[q][2] INTO v;
      IF r > 0 THEN
        INSERT INTO timings VALUES (r, queries[q][1], extract(epoch FROM clock_timestamp() - t0) * 1000);
      END IF;
    END LOOP;
  END LOOP;
END
\$\$;
SELECT what, percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), min(ms), max(ms), count(*),
       (SELECT count(*) FROM bodies), (SELECT avg(length(b)) FROM bodies)
FROM timings GROUP BY what;
SQL

server=$(psql_ -At -c "SHOW server_version")
awk -v rows="$rows" -v server="$server" -v rounds="$rounds" '
  { med[$1] = $2; mn[$1] = $3; mx[$1] = $4; n = $6; avg = $7 }
  END {
    printf "fingerprint vs sha256 on %d bodies of %.0f bytes (PostgreSQL %s, %d rounds, medians):\n", n, avg, server, rounds
    split("scan sha256 fingerprint fp_noset", order, " ")
    for (i = 1; i <= 4; i++) {
      w = order[i]
      printf "  %-12s %8.1f ms  %6.2f us/row  (min %.1f, max %.1f ms)\n", w, med[w], med[w] * 1000 / n, mn[w], mx[w]
    }
    ratio = med["fingerprint"] / med["sha256"]
    net = (med["fingerprint"] - med["scan"]) / (med["sha256"] - med["scan"])
    printf "  ratio fingerprint/sha256 = %.2f (goal <= 3: %s); net of the scan %.2f; without SET search_path %.2f\n",
      ratio, ratio <= 3 ? "met" : "MISSED", net, med["fp_noset"] / med["sha256"]
    printf "{\"impl\":\"sql\",\"rows\":%d,\"body_bytes\":%.0f,\"server\":\"%s\",\"rounds\":%d,\"scan_us\":%.3f,\"sha256_us\":%.3f,\"fingerprint_us\":%.3f,\"fp_noset_us\":%.3f,\"ratio\":%.2f}\n",
      n, avg, server, rounds, med["scan"] * 1000 / n, med["sha256"] * 1000 / n, med["fingerprint"] * 1000 / n, med["fp_noset"] * 1000 / n, ratio
  }' "$pgdir/result.txt"
