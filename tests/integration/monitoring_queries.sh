#!/usr/bin/env bash
# examples/monitoring/postgres_exporter_queries.yaml works as shipped: every
# query runs as a role with only the monitoring grants of the docs, returns
# every column its metrics name (a HISTOGRAM column also <c>_bucket, _sum and
# _count, with as many bounds as buckets), and counts what happened: calls,
# a wait, an abandoned lease, an expired key. Runs against the cluster of
# scripts/test.sh (which preloads the library).
set -euo pipefail
cd "$(dirname "$0")/../.."
db=idem_monitoring
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
trap 'psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" -c "DROP ROLE IF EXISTS idem_exporter" >/dev/null 2>&1 || true' EXIT
psql -X -q -v ON_ERROR_STOP=1 -d "$db" <<'SQL'
CREATE EXTENSION idempotency;
DROP ROLE IF EXISTS idem_exporter;
CREATE ROLE idem_exporter NOLOGIN;
-- the monitoring block of docs/sql-reference.md
GRANT USAGE ON SCHEMA idempotency TO idem_exporter;
GRANT SELECT ON idempotency.status, idempotency.stats TO idem_exporter;
GRANT EXECUTE ON FUNCTION idempotency.stats_counters() TO idem_exporter;
SELECT idempotency.stats_reset() IS NOT NULL;
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'k1', 'mon_order', idempotency.fingerprint('POST', '/o'));
SELECT idempotency.complete('p', 'k1', status => 201);
COMMIT;
SELECT outcome FROM idempotency.begin('p', 'k1', 'mon_order', idempotency.fingerprint('POST', '/x'));
SELECT outcome FROM idempotency.acquire('p', 'k2', 'mon_charge', idempotency.fingerprint('POST', '/c'), lease => '100 ms');
SELECT pg_sleep(0.2);
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
VALUES ('p', 'old', 'mon_order', decode(repeat('00', 32), 'hex'), 'completed', 200, now() - interval '2 hours',
        now() - interval '1 hour');
SQL
# One wait for a held key: a transaction holds k3 while another begin() waits 100 ms for it.
psql -X -q -d "$db" -c "BEGIN; SELECT idempotency.begin('p', 'k3', 'mon_order', idempotency.fingerprint('POST', '/o')); SELECT pg_sleep(1); ROLLBACK;" >/dev/null &
holder=$!
sleep 0.3
psql -X -q -At -d "$db" -c "SELECT outcome FROM idempotency.begin('p', 'k3', 'mon_order', idempotency.fingerprint('POST', '/o'), wait => '100 ms')"
wait "$holder"

/usr/bin/python3 - "$db" <<'PY'
import sys, yaml, psycopg
db = sys.argv[1]
queries = yaml.safe_load(open("examples/monitoring/postgres_exporter_queries.yaml"))
failures = []
results = {}
with psycopg.connect(dbname=db, autocommit=True) as conn:
    conn.execute("SET ROLE idem_exporter")
    for name, q in queries.items():
        cur = conn.execute(q["query"])
        columns = [d.name for d in cur.description]
        rows = [dict(zip(columns, r)) for r in cur.fetchall()]
        results[name] = rows
        if not rows:
            failures.append(f"{name}: no rows")
        for metric in q["metrics"]:
            (column, spec), = metric.items()
            need = [column]
            if spec["usage"] == "HISTOGRAM":
                need += [column + "_bucket", column + "_sum", column + "_count"]
            for c in need:
                if c not in columns:
                    failures.append(f"{name}: column {c} missing")
            if spec["usage"] == "HISTOGRAM":
                for r in rows:
                    if len(r[column]) != len(r[column + "_bucket"]):
                        failures.append(f"{name}: bounds and buckets differ in length")
                    if r[column + "_bucket"] and r[column + "_bucket"][-1] > r[column + "_count"]:
                        failures.append(f"{name}: a bucket holds more than the count")
def row(name, action):
    for r in results[name]:
        if r.get("database") == db and r.get("action") == action:
            return r
    failures.append(f"{name}: no row for {action}")
    return None
calls = row("idempotency_calls", "mon_order")
if calls and (calls["begin_started"], calls["completed"], calls["begin_mismatch"], calls["begin_in_progress"]) != (2, 1, 1, 1):
    failures.append(f"idempotency_calls mon_order: {calls}")
charge = row("idempotency_calls", "mon_charge")
if charge and charge["acquire_started"] != 1:
    failures.append(f"idempotency_calls mon_charge: {charge}")
wait = row("idempotency_wait", "mon_order")
if wait and not (wait["seconds_count"] == 1 and 0.09 <= wait["seconds_sum"] and wait["max_seconds"] >= 0.09):
    failures.append(f"idempotency_wait mon_order: {wait}")
keys = results["idempotency_keys"][0] if results["idempotency_keys"] else {}
if not (keys.get("abandoned") == 1 and keys.get("expired") == 1 and keys.get("oldest_expired_age_seconds", 0) >= 3500):
    failures.append(f"idempotency_keys: {keys}")
print("idempotency_calls mon_order:", {k: v for k, v in (calls or {}).items() if v})
print("idempotency_wait mon_order:", wait)
print("idempotency_keys:", keys)
if failures:
    print("FAIL:", *failures, sep="\n  ")
    sys.exit(1)
print("exporter queries: ok")
PY
