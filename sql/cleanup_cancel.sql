-- "The batches done so far stay deleted" when cleanup is cancelled
-- (docs/operations.md): a cleanup of 30 expired rows in batches of 5 with a
-- pause of 300 ms, stopped by statement_timeout after 1 s. The pauses alone
-- take 1.5 s, so the timeout always comes before the last batch; the first
-- batch runs at once, so at least one is done. Which batch the cancel meets
-- depends on the machine: the test asserts only what holds for any of them.
\set VERBOSITY sqlstate
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'cancel', 'old-' || i, 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200,
       timestamptz '1999-12-31 00:00+00', timestamptz '2000-01-01 00:00+00' + i * interval '1 minute'
  FROM generate_series(1, 30) AS i;
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'cancel', 'live-' || i, 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200, now(), now() + interval '1 day'
  FROM generate_series(1, 3) AS i;
CREATE TEMP TABLE live_before AS
SELECT key, xmin::text AS version FROM idempotency.keys WHERE principal = 'cancel' AND expires_at > now();

SET statement_timeout = '1s';
CALL idempotency.cleanup(batch_size => 5, pause => '300 ms');
RESET statement_timeout;

-- Whole batches are gone, some but not all of them, and they are the oldest:
-- what is left is exactly the newest rows, old-(k+1) to old-30.
SELECT gone % 5 = 0 AS whole_batches, gone BETWEEN 5 AND 25 AS some_not_all,
       left_keys = ARRAY(SELECT 'old-' || i FROM generate_series(gone + 1, 30) AS i) AS the_newest_are_left
  FROM (SELECT 30 - count(*) AS gone, array_agg(key ORDER BY expires_at) AS left_keys
          FROM idempotency.keys WHERE principal = 'cancel' AND key LIKE 'old-%') AS s;
-- The live rows were not touched.
SELECT count(*) AS live_rows_changed
  FROM live_before AS b
 WHERE NOT EXISTS (SELECT FROM idempotency.keys AS k
                    WHERE k.principal = 'cancel' AND k.key = b.key AND k.xmin::text = b.version);
-- The next run deletes the rest.
CALL idempotency.cleanup(batch_size => 5) \gset
SELECT count(*) FILTER (WHERE expires_at <= now()) AS expired_left, count(*) FILTER (WHERE expires_at > now()) AS live_left
  FROM idempotency.keys WHERE principal = 'cancel';
DELETE FROM idempotency.keys;
