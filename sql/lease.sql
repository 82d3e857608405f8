-- The lease protocol: acquire / renew / complete(fence) / release / claim.
\set VERBOSITY sqlstate
-- Fences come from the clock: the file shows them by name, 1, 2, 3... in the order they appear.
\i sql/include/fence_names.psql
CREATE FUNCTION fp(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/v1/call', convert_to(t, 'UTF8')) $$;

-- acquire starts a lease: an in_progress row with fence 1, committed at once.
SELECT outcome, pg_temp.fence_no(fence) AS fence, lease_until > clock_timestamp() AS leased, expires_at - created_at AS ttl
  FROM idempotency.acquire('alice', 'l-1', 'charge', fp('{"amount":5}'), lease => '10 min');
SELECT state, pg_temp.fence_no(fence) AS fence, response_status FROM idempotency.keys WHERE key = 'l-1';
-- While the lease is live, acquire and begin both answer in_progress (with lease_until).
SELECT outcome, pg_temp.fence_no(fence) AS fence, lease_until IS NOT NULL AS has_lease_until
  FROM idempotency.acquire('alice', 'l-1', 'charge', fp('{"amount":5}'), wait => '0');
BEGIN;
SELECT outcome, lease_until IS NOT NULL AS has_lease_until
  FROM idempotency.begin('alice', 'l-1', 'charge', fp('{"amount":5}'), wait => '0');
ROLLBACK;
-- Another request under the key is a mismatch, lease or not.
SELECT outcome FROM idempotency.acquire('alice', 'l-1', 'charge', fp('{"amount":6}'));
-- renew extends the lease only for the current fence.
SELECT idempotency.renew('alice', 'l-1', pg_temp.fence(1), '10 min') AS renewed, idempotency.renew('alice', 'l-1', 7) AS wrong_fence;
-- complete with the fence stores the response; any status can be stored here.
SELECT idempotency.complete('alice', 'l-1', fence => pg_temp.fence(1), status => 502, body => convert_to('upstream said no', 'UTF8'),
                            headers => '{"Content-Type":"text/plain"}');
SELECT outcome, response_status, convert_from(response_body, 'UTF8') AS body, response_headers,
       pg_temp.fence_no(fence) AS fence
  FROM idempotency.acquire('alice', 'l-1', 'charge', fp('{"amount":5}'));
-- A completed key cannot be completed, renewed or released again.
SELECT idempotency.complete('alice', 'l-1', fence => pg_temp.fence(1), status => 200) AS again,
       idempotency.renew('alice', 'l-1', pg_temp.fence(1)) AS renew_done,
       idempotency.release('alice', 'l-1', pg_temp.fence(1)) AS release_done;

-- An expired lease is taken over with a higher fence (2, then 3); the stale holder is fenced out.
SELECT outcome, pg_temp.fence_no(fence) AS fence FROM idempotency.acquire('alice', 'l-2', 'charge', fp('{}'), lease => '100 ms');
SELECT pg_sleep(0.15);
SELECT outcome, pg_temp.fence_no(fence) AS fence FROM idempotency.acquire('alice', 'l-2', 'charge', fp('{}'), lease => '10 min');
SELECT idempotency.renew('alice', 'l-2', pg_temp.fence(2)) AS stale_renew,
       idempotency.complete('alice', 'l-2', fence => pg_temp.fence(2), status => 200,
                            body => convert_to('stale', 'UTF8')) AS stale_complete,
       idempotency.release('alice', 'l-2', pg_temp.fence(2)) AS stale_release;
SELECT state, pg_temp.fence_no(fence) AS fence, response_body FROM idempotency.keys WHERE key = 'l-2';
SELECT idempotency.complete('alice', 'l-2', fence => pg_temp.fence(3), status => 200,
                            body => convert_to('fresh', 'UTF8')) AS current_complete;
SELECT convert_from(response_body, 'UTF8') AS body, pg_temp.fence_no(fence) AS fence FROM idempotency.keys WHERE key = 'l-2';

-- begin on a key whose lease ran out (fence 4) starts with fence 5, and complete replaces the row.
SELECT outcome, pg_temp.fence_no(fence) AS fence FROM idempotency.acquire('alice', 'l-3', 'charge', fp('{}'), lease => '100 ms');
SELECT pg_sleep(0.15);
BEGIN;
SELECT outcome, pg_temp.fence_no(fence) AS fence FROM idempotency.begin('alice', 'l-3', 'charge', fp('{}'));
SELECT idempotency.complete('alice', 'l-3', 201, convert_to('by begin', 'UTF8'));
COMMIT;
SELECT state, pg_temp.fence_no(fence) AS fence, convert_from(response_body, 'UTF8') AS body FROM idempotency.keys WHERE key = 'l-3';

-- release ends the lease (fence 6) so that a retry runs again, with a higher fence.
SELECT outcome, pg_temp.fence_no(fence) AS fence FROM idempotency.acquire('alice', 'l-4', 'charge', fp('{}'));
SELECT idempotency.release('alice', 'l-4', pg_temp.fence(6)) AS released,
       idempotency.release('alice', 'l-4', pg_temp.fence(6)) AS released_twice;
SELECT outcome, pg_temp.fence_no(fence) AS fence FROM idempotency.acquire('alice', 'l-4', 'charge', fp('{}'));
SELECT idempotency.renew('alice', 'l-4', pg_temp.fence(6)) AS old_fence_renew;

-- one_time_secret through the fenced complete (fence 8).
SELECT outcome, pg_temp.fence_no(fence) AS fence FROM idempotency.acquire('alice', 'l-5', 'create_key', fp('{}'));
SELECT idempotency.complete('alice', 'l-5', fence => pg_temp.fence(8), status => 201, body => convert_to('sk_123', 'UTF8'), one_time_secret => true);
SELECT outcome, response_status, response_body FROM idempotency.acquire('alice', 'l-5', 'create_key', fp('{}'));

-- claim: true for the first caller within the window.
SELECT idempotency.claim('alice', 'job-1') AS first, idempotency.claim('alice', 'job-1') AS second,
       idempotency.claim('bob', 'job-1') AS other_principal;
SELECT idempotency.claim('alice', 'job-2', ttl => '100 ms') AS short;
SELECT pg_sleep(0.15);
SELECT idempotency.claim('alice', 'job-2') AS after_expiry;
SELECT outcome FROM idempotency.acquire('alice', 'job-1', 'charge', fp('{}'));

-- The lease setting and argument checks.
SET idempotency.lease = '2 s';
SELECT (lease_until - clock_timestamp()) BETWEEN interval '1 s' AND interval '2 s' AS default_lease
  FROM idempotency.acquire('alice', 'l-6', 'charge', fp('{}'));
RESET idempotency.lease;
SET idempotency.lease = 0;
SELECT idempotency.acquire('alice', 'l-7', 'charge', fp('{}'), lease => '0');
SELECT idempotency.acquire('alice', 'l-7', 'charge', fp('{}'), lease => '-1 s');
-- One range for the setting and the argument: 100 ms to 24 h.
SET idempotency.lease = 99;
SET idempotency.lease = '25 h';
SELECT idempotency.acquire('alice', 'l-7', 'charge', fp('{}'), lease => '99 ms');
SELECT idempotency.acquire('alice', 'l-7', 'charge', fp('{}'), lease => '1000 years');
SELECT idempotency.acquire('alice', 'l-7', 'charge', fp('{}'), ttl => '1000 years');
SELECT idempotency.acquire('alice', 'l-7', 'charge', fp('{}'), ttl => '178000000 years');
SELECT idempotency.renew('alice', 'l-6', NULL);
SELECT idempotency.renew('alice', 'l-6', 1, '0');
SELECT idempotency.complete('alice', 'l-6', fence => 1, status => 600);
SELECT idempotency.claim('alice', '');
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'l-8', 'charge', fp('{}'));
SELECT idempotency.acquire('alice', 'l-8', 'charge', fp('{}'));
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'l-8', 'charge', fp('{}'));
SELECT idempotency.claim('alice', 'l-8');
ROLLBACK;
BEGIN READ ONLY;
SELECT idempotency.acquire('alice', 'l-9', 'charge', fp('{}'));
ROLLBACK;

-- Each fence shown was above every fence shown before it.
SELECT pg_temp.fences_in_order() AS fences_grow;

-- Leave the database as we found it for the next test file.
DELETE FROM idempotency.keys;
DROP FUNCTION fp(text);
