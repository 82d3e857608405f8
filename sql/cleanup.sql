-- Cleanup of expired keys, the status view and the support lookup.
\set VERBOSITY sqlstate
-- Fences come from one sequence; start it afresh so that this file's numbers read 1, 2, 3...
ALTER SEQUENCE idempotency.fences RESTART;
-- 25 expired keys (two actions), 3 live ones, 1 live lease.
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'p', 'old-' || i, CASE WHEN i % 2 = 0 THEN 'create_order' ELSE 'refund' END, decode(repeat('00', 32), 'hex'),
       'completed', 201, now() - interval '2 days' - i * interval '1 minute', now() - interval '1 day' - i * interval '1 minute'
  FROM generate_series(1, 25) AS i;
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'p', 'new-' || i, 'create_order', decode(repeat('00', 32), 'hex'), 'completed', 201,
       now() - i * interval '1 minute', now() + interval '1 day'
  FROM generate_series(1, 3) AS i;
SELECT outcome FROM idempotency.acquire('p', 'leased', 'charge', decode(repeat('00', 32), 'hex'), lease => '1 hour');

-- The status view: rows by action, state, live vs expired (counts and times
-- only); the oldest key of each group is in idempotency.oldest_keys.
SELECT s.action, s.state, s.live, s.keys, s.leases_live, o.principal AS oldest_principal, o.key AS oldest_key,
       s.earliest_lease_until IS NOT NULL AS has_lease, o.created_at = s.oldest_created_at AS oldest_matches
  FROM idempotency.status AS s JOIN idempotency.oldest_keys AS o USING (action, state, live)
 ORDER BY action, state, live;
SELECT count(*) AS status_columns_naming_keys
  FROM pg_attribute WHERE attrelid = 'idempotency.status'::regclass AND attnum > 0
   AND (attname LIKE '%principal%' OR attname LIKE '%key' OR attname LIKE '%resource%');

-- One batch only: max_runtime 0 stops after the first.
CALL idempotency.cleanup(batch_size => 10, max_runtime => '0');
SELECT count(*) AS expired_left FROM idempotency.keys WHERE expires_at <= now();
-- The oldest expiry went first.
SELECT min(key) FILTER (WHERE key LIKE 'old-%') AS some_left, count(*) FILTER (WHERE key IN ('old-25', 'old-20')) AS oldest_gone
  FROM idempotency.keys;
-- Until a batch is short: the rest, in batches of 10, then 5.
CALL idempotency.cleanup(batch_size => 10);
SELECT count(*) FILTER (WHERE expires_at <= now()) AS expired_left, count(*) FILTER (WHERE expires_at > now()) AS live_kept
  FROM idempotency.keys;
-- Reruns are harmless.
CALL idempotency.cleanup();
-- The default batch size comes from the setting.
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'p', 'older-' || i, 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200, now() - interval '2 days',
       now() - interval '1 day'
  FROM generate_series(1, 7) AS i;
SET idempotency.cleanup_batch_size = 3;
CALL idempotency.cleanup(max_runtime => '0');
RESET idempotency.cleanup_batch_size;
CALL idempotency.cleanup(pause => '1 ms');
SET idempotency.cleanup_batch_size = 0;
CALL idempotency.cleanup(batch_size => 0);
CALL idempotency.cleanup(max_runtime => '-1 s');

SELECT action, state, live, keys FROM idempotency.status ORDER BY action, state, live;

-- lookup: one key for support, without body or headers.
SELECT state, action, live, response_status, fence, lease_until IS NOT NULL AS leased
  FROM idempotency.lookup('p', 'new-1');
-- (its fence is acquire's: the clock in microseconds since 1970)
SELECT state, action, live, to_timestamp(fence / 1e6) BETWEEN now() - interval '1 h' AND clock_timestamp() AS clock_fence,
       lease_until > now() AS leased
  FROM idempotency.lookup('p', 'leased');
SELECT count(*) AS absent FROM idempotency.lookup('p', 'nope');

-- Without pg_cron in this database: 55000, with a hint.
SELECT idempotency.schedule_cleanup();
SELECT idempotency.unschedule_cleanup();
-- The hint names the pg_cron package of this server's major version.
DO $$
DECLARE
    hint text;
BEGIN
    PERFORM idempotency.schedule_cleanup();
    RAISE EXCEPTION 'schedule_cleanup ran without pg_cron';
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
    IF strpos(hint, format('postgresql-%s-cron', current_setting('server_version_num')::int / 10000)) = 0 THEN
        RAISE EXCEPTION 'the hint names another package: %', hint;
    END IF;
END
$$;

-- Each batch resumes at the latest expiry of the one before; rows sharing that
-- expiry that did not fit are taken by the next batch, rows expiring earlier
-- than `after` are left alone.
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'q', 'tie-' || i, 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200, '1999-01-01 00:00+00',
       CASE WHEN i <= 2 THEN timestamptz '2000-01-01 00:00+00' ELSE timestamptz '2000-01-02 00:00+00' END
  FROM generate_series(1, 6) AS i;
SELECT deleted, last_expiry = '2000-01-02 00:00+00' AS at_the_tie FROM idempotency.cleanup_batch(3, NULL);
SELECT count(*) AS left_at_the_tie FROM idempotency.keys WHERE principal = 'q' AND expires_at = '2000-01-02 00:00+00';
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
VALUES ('q', 'earlier', 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200, '1999-01-01 00:00+00',
        '2000-01-01 12:00+00');
SELECT deleted, last_expiry = '2000-01-02 00:00+00' AS same_expiry
  FROM idempotency.cleanup_batch(10, '2000-01-02 00:00+00');
SELECT key FROM idempotency.keys WHERE principal = 'q';
SELECT deleted, last_expiry IS NULL AS nothing_deleted FROM idempotency.cleanup_batch(10, '2000-01-02 00:00+00');
SELECT deleted FROM idempotency.cleanup_batch(10, NULL);
SELECT deleted FROM idempotency.cleanup_batch(NULL, NULL);

-- Operators only.
SELECT has_table_privilege('public', 'idempotency.status', 'SELECT') AS public_status,
       has_function_privilege('public', 'idempotency.lookup(text,text)', 'EXECUTE') AS public_lookup,
       to_regprocedure('idempotency.cleanup_batch(integer)') IS NULL AS old_batch_dropped,
       has_function_privilege('public', 'idempotency.cleanup_batch(integer,timestamptz)', 'EXECUTE') AS public_resume;

DELETE FROM idempotency.keys;
