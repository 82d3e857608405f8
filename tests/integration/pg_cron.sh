#!/usr/bin/env bash
# Cleanup scheduled with pg_cron (preloaded by scripts/pgcluster.sh, with
# cron.database_name = idem_cron): schedule twice (one job), insert expired
# keys, see the job remove them at the next minute boundary (pg_cron 1.4 has
# minute granularity), unschedule. Also: without pg_cron created in a database,
# schedule_cleanup() fails with 55000.
set -euo pipefail
cd "$(dirname "$0")/../.."
db=idem_cron
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" -c "$1"; }

psql -X -q -v ON_ERROR_STOP=1 -d "$db" <<'SQL'
DROP EXTENSION IF EXISTS idempotency CASCADE;
DROP EXTENSION IF EXISTS pg_cron CASCADE;
CREATE EXTENSION idempotency;
SQL
state=$(psql -X -q -At -d "$db" -c "\set VERBOSITY sqlstate" -c "SELECT idempotency.schedule_cleanup()" 2>&1 || true)
echo "without pg_cron: $state"
[[ $state == *55000* ]]

q "CREATE EXTENSION pg_cron"
first=$(q "SELECT idempotency.schedule_cleanup()")
second=$(q "SELECT idempotency.schedule_cleanup('* * * * *')")
jobs=$(q "SELECT count(*) FROM cron.job WHERE jobname = 'idempotency:cleanup'")
echo "scheduled job $first, then $second; jobs named idempotency:cleanup: $jobs"
[[ $first == "$second" && $jobs == 1 ]]

q "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
   SELECT 'cron', 'expired-' || i, 'test', decode(repeat('00', 32), 'hex'), 'completed', 200,
          now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, 500) AS i"
q "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
   VALUES ('cron', 'live', 'test', decode(repeat('00', 32), 'hex'), 'completed', 200, now(), now() + interval '1 day')"
# An action whose expiry policy is refuse (0.8.0): the job keeps tombstones of its keys.
q "SELECT idempotency.set_expiry_policy('refund_card', 'refuse')" >/dev/null
q "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
   SELECT 'cron', 'tomb-' || i, 'refund_card', decode(repeat('00', 32), 'hex'), 'completed', 200,
          now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, 20) AS i"
echo "waiting for the job (at most 80 s)..."
for _ in $(seq 80); do
  left=$(q "SELECT count(*) FROM idempotency.keys WHERE key LIKE 'expired-%'")
  [[ $left == 0 ]] && break
  sleep 1
done
echo "expired keys left: $left"
q "SELECT status || ': ' || return_message FROM cron.job_run_details ORDER BY start_time DESC LIMIT 1"
[[ $left == 0 ]]
[[ $(q "SELECT count(*) FROM idempotency.keys WHERE key = 'live'") == 1 ]]
tombstones=$(q "SELECT count(*) FROM idempotency.keys WHERE key LIKE 'tomb-%' AND state = 'expired'")
echo "tombstones kept by the job: $tombstones"
[[ $tombstones == 20 ]]
[[ $(q "SELECT count(*) FROM cron.job_run_details WHERE status = 'succeeded'") -ge 1 ]]

[[ $(q "SELECT idempotency.unschedule_cleanup()") == t ]]
[[ $(q "SELECT idempotency.unschedule_cleanup()") == f ]]
[[ $(q "SELECT count(*) FROM cron.job") == 0 ]]
q "DROP EXTENSION pg_cron"
echo "pg_cron: scheduled, ran, unscheduled"
