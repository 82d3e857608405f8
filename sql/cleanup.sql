-- Cleanup of expired keys, the status view and the support lookup.
\set VERBOSITY sqlstate
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

-- The status view: rows by action, state, live vs expired, with the oldest key.
SELECT action, state, live, keys, leases_live, oldest_principal, oldest_key, earliest_lease_until IS NOT NULL AS has_lease
  FROM idempotency.status ORDER BY action, state, live;

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
SELECT state, action, live, fence, lease_until > now() AS leased FROM idempotency.lookup('p', 'leased');
SELECT count(*) AS absent FROM idempotency.lookup('p', 'nope');

-- Without pg_cron in this database: 55000, with a hint.
SELECT idempotency.schedule_cleanup();
SELECT idempotency.unschedule_cleanup();

-- Operators only.
SELECT has_table_privilege('public', 'idempotency.status', 'SELECT') AS public_status,
       has_function_privilege('public', 'idempotency.lookup(text,text)', 'EXECUTE') AS public_lookup,
       has_function_privilege('public', 'idempotency.cleanup_batch(integer)', 'EXECUTE') AS public_batch;

DELETE FROM idempotency.keys;
