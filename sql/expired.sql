-- Expiry that says so: idempotency.set_expiry_policy, tombstones that cleanup
-- leaves for the keys of a refusing action, and the outcome `expired`. The
-- suite runs again in the distributed mode (statement back-end): the answers
-- must be the same. Policies are removed at the end (later files share the
-- database).
\set VERBOSITY sqlstate
CREATE FUNCTION efp(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/pay', convert_to(t, 'UTF8')) $$;
-- Makes a key expire a second ago (and its lease, if any, run out), as the
-- HTTP tests do: the time it expired is kept in exp_at for the checks below.
CREATE TABLE exp_at (key text PRIMARY KEY, created_at timestamptz, expired_at timestamptz);
CREATE FUNCTION expire(k text) RETURNS void LANGUAGE sql AS $$
    UPDATE idempotency.keys SET created_at = now() - interval '1 hour', expires_at = now() - interval '1 second',
                                lease_until = CASE WHEN lease_until IS NULL THEN NULL ELSE now() - interval '2 seconds' END
     WHERE principal = 'exp' AND key = k;
    INSERT INTO exp_at SELECT key, created_at, expires_at FROM idempotency.keys WHERE principal = 'exp' AND key = k
        ON CONFLICT (key) DO UPDATE SET created_at = excluded.created_at, expired_at = excluded.expired_at;
$$;
-- An outcome row, its times compared with what the key had.
CREATE FUNCTION shown(o idempotency.key_outcome, k text) RETURNS TABLE (
        outcome text, created_is_original boolean, expires_is_when_expired boolean, others_null boolean)
    LANGUAGE sql AS $$
    SELECT o.outcome, o.created_at = e.created_at, o.expires_at = e.expired_at,
           o.response_status IS NULL AND o.response_headers IS NULL AND o.response_body IS NULL
           AND o.resource_id IS NULL AND o.fence IS NULL AND o.lease_until IS NULL
      FROM exp_at AS e WHERE e.key = k
$$;

-- Expired keys of earlier files go first, so that the counts below are this file's.
CALL idempotency.cleanup();

-- The policy: its arguments, and the table that holds it.
SELECT idempotency.set_expiry_policy('pay', 'sometimes');
SELECT idempotency.set_expiry_policy('pay', NULL);
SELECT idempotency.set_expiry_policy(NULL, 'refuse');
SELECT idempotency.set_expiry_policy('pay', 'refuse', '0');
SELECT idempotency.set_expiry_policy('pay', 'refuse', '-1 day');
SELECT idempotency.set_expiry_policy('pay', 'refuse', '367 days');
SELECT idempotency.set_expiry_policy('pay', 'refuse', NULL);
SELECT idempotency.set_expiry_policy('pay', 'refuse', '366 days');
SELECT idempotency.set_expiry_policy('pay', 'refuse');
SELECT idempotency.set_expiry_policy('claim', 'refuse', '1 day');
SELECT idempotency.set_expiry_policy('browse', 'refuse');
SELECT idempotency.set_expiry_policy('browse', 'run');
SELECT idempotency.set_expiry_policy('nothing-set', 'run');
SELECT * FROM idempotency.expiry_policies ORDER BY action;
SELECT has_function_privilege('public', 'idempotency.set_expiry_policy(text, text, interval)', 'EXECUTE')
           AS public_sets,
       has_table_privilege('public', 'idempotency.expiry_policies', 'SELECT') AS public_reads;

-- Keys: two of the refusing action (one a one-time secret), one of an action
-- that runs again, one lease left in progress, one claim.
BEGIN;
SELECT outcome FROM idempotency.begin('exp', 'k-pay', 'pay', efp('a'));
SELECT idempotency.complete('exp', 'k-pay', 201, '\x7061696421', '{"Location": "/pay/1"}', 'pay-1');
SELECT outcome FROM idempotency.begin('exp', 'k-secret', 'pay', efp('s'));
SELECT idempotency.complete('exp', 'k-secret', 201, '\x736563726574', NULL, 'tok-1', one_time_secret => true);
SELECT outcome FROM idempotency.begin('exp', 'k-browse', 'browse', efp('b'));
SELECT idempotency.complete('exp', 'k-browse', 200, '\x6c697374');
COMMIT;
SELECT outcome FROM idempotency.acquire('exp', 'k-lease', 'pay', efp('l'), lease => '1 hour');
SELECT idempotency.claim('exp', 'k-claim', '1 hour') AS claimed;
SELECT expire(k) FROM unnest(ARRAY['k-pay', 'k-secret', 'k-browse', 'k-lease', 'k-claim']) AS k;

-- Expired, and cleanup has not run yet: the policy already refuses.
SELECT s.* FROM idempotency.begin('exp', 'k-pay', 'pay', efp('a')) AS o, shown(o, 'k-pay') AS s;
SELECT outcome, resource_id FROM idempotency.begin('exp', 'k-pay', 'pay', efp('other'));
SELECT s.* FROM idempotency.acquire('exp', 'k-lease', 'pay', efp('l')) AS o, shown(o, 'k-lease') AS s;
SELECT idempotency.claim('exp', 'k-claim', '1 hour') AS claimed_again;
SELECT idempotency.save_final('exp', 'k-pay', 'pay', efp('a'), 422, '\x6e6f') AS saved;
-- An action that runs again: started, as before 0.8.0.
BEGIN;
SELECT outcome FROM idempotency.begin('exp', 'k-browse', 'browse', efp('b'));
ROLLBACK;

-- Cleanup: tombstones for pay and claim (four keys), the browse key deleted: five cleaned.
SELECT deleted, last_expiry = (SELECT max(expired_at) FROM exp_at) AS last_is_latest
  FROM idempotency.cleanup_batch(1000);
SELECT k.key, k.state, k.action, k.request_sha256 IS NOT NULL AS has_fingerprint,
       k.response_status IS NULL AND k.response_headers IS NULL AND k.response_body IS NULL
           AND k.resource_id IS NULL AS holds_nothing,
       k.one_time_secret, k.created_at = e.created_at AS created_kept,
       k.lease_until = e.expired_at AS lease_until_is_expiry,
       k.expires_at = e.expired_at + p.grace AS goes_after_grace
  FROM idempotency.keys AS k JOIN exp_at AS e USING (key) JOIN idempotency.expiry_policies AS p USING (action)
 WHERE k.principal = 'exp' ORDER BY k.key;
SELECT count(*) AS browse_left FROM idempotency.keys WHERE principal = 'exp' AND key = 'k-browse';
-- Nothing of the response can be written into a tombstone.
UPDATE idempotency.keys SET response_body = '\x00' WHERE principal = 'exp' AND key = 'k-pay';
UPDATE idempotency.keys SET one_time_secret = true WHERE principal = 'exp' AND key = 'k-secret';

-- Every call on a tombstone.
SELECT s.* FROM idempotency.begin('exp', 'k-pay', 'pay', efp('a')) AS o, shown(o, 'k-pay') AS s;
SELECT s.* FROM idempotency.begin('exp', 'k-secret', 'pay', efp('s')) AS o, shown(o, 'k-secret') AS s;
SELECT s.* FROM idempotency.acquire('exp', 'k-pay', 'pay', efp('a')) AS o, shown(o, 'k-pay') AS s;
SELECT outcome, resource_id, response_status FROM idempotency.begin('exp', 'k-pay', 'pay', efp('other'));
SELECT outcome, resource_id, response_status FROM idempotency.acquire('exp', 'k-pay', 'pay', efp('other'));
SELECT s.* FROM idempotency.acquire('exp', 'k-lease', 'pay', efp('l')) AS o, shown(o, 'k-lease') AS s;
SELECT idempotency.claim('exp', 'k-pay', '1 hour') AS claimed_tombstone,
       idempotency.claim('exp', 'k-claim', '1 hour') AS claimed_claim;
SELECT idempotency.save_final('exp', 'k-pay', 'pay', efp('a'), 422, '\x6e6f') AS saved;
SELECT idempotency.renew('exp', 'k-lease', fence) AS renewed, idempotency.release('exp', 'k-lease', fence) AS released,
       idempotency.complete('exp', 'k-lease', 200, fence => fence) AS completed
  FROM idempotency.keys WHERE principal = 'exp' AND key = 'k-lease';
SELECT state, action, live, response_status, resource_id, one_time_secret,
       lease_until = (SELECT expired_at FROM exp_at WHERE key = 'k-pay') AS lease_until_is_expiry
  FROM idempotency.lookup('exp', 'k-pay');
-- The status view and oldest_keys: tombstones in a state of their own.
SELECT action, state, live, keys FROM idempotency.status WHERE state = 'expired' ORDER BY 1, 2, 3;
SELECT action, state, live, key FROM idempotency.oldest_keys WHERE principal = 'exp' ORDER BY 1, 2, 3;
-- A second cleanup leaves the tombstones alone (they are live until they go).
SELECT deleted FROM idempotency.cleanup_batch(1000);
SELECT count(*) AS tombstones FROM idempotency.keys WHERE principal = 'exp' AND state = 'expired';

-- Past its grace a tombstone is dead: the key starts again, and cleanup deletes it.
UPDATE idempotency.keys SET expires_at = now() - interval '1 second' WHERE principal = 'exp' AND key = 'k-secret';
BEGIN;
SELECT outcome, response_status IS NULL AS no_status FROM idempotency.begin('exp', 'k-secret', 'pay', efp('s'));
SELECT idempotency.complete('exp', 'k-secret', 201, '\x6e6577');
COMMIT;
SELECT state, response_status FROM idempotency.lookup('exp', 'k-secret');
UPDATE idempotency.keys SET expires_at = now() - interval '1 second' WHERE principal = 'exp' AND key = 'k-claim';
SELECT deleted FROM idempotency.cleanup_batch(1000);
SELECT key FROM idempotency.keys WHERE principal = 'exp' ORDER BY key;
-- A key that expired longer ago than the grace is deleted, not kept.
BEGIN;
SELECT outcome FROM idempotency.begin('exp', 'k-old', 'pay', efp('o'));
SELECT idempotency.complete('exp', 'k-old', 201);
COMMIT;
UPDATE idempotency.keys SET created_at = now() - interval '30 days', expires_at = now() - interval '8 days'
 WHERE principal = 'exp' AND key = 'k-old';
BEGIN;
SELECT outcome FROM idempotency.begin('exp', 'k-old', 'pay', efp('o'));
ROLLBACK;
SELECT deleted FROM idempotency.cleanup_batch(1000);
SELECT count(*) AS old_left FROM idempotency.keys WHERE principal = 'exp' AND key = 'k-old';
-- forget() removes a tombstone (support tool).
SELECT idempotency.forget('exp', 'k-pay') AS forgotten;
BEGIN;
SELECT outcome FROM idempotency.begin('exp', 'k-pay', 'pay', efp('a'));
ROLLBACK;

-- The procedure and its loop: tombstones count as cleaned, batches resume.
BEGIN;
SELECT o.outcome FROM generate_series(1, 5) AS i, idempotency.begin('exp', 'p-' || i, 'pay', efp('p')) AS o;
SELECT idempotency.complete('exp', 'p-' || i, 201) FROM generate_series(1, 5) AS i;
COMMIT;
SELECT expire('p-' || i) FROM generate_series(1, 5) AS i;
CALL idempotency.cleanup(batch_size => 2);
SELECT count(*) FILTER (WHERE state = 'expired') AS tombstones, count(*) FILTER (WHERE expires_at <= now()) AS dead
  FROM idempotency.keys WHERE principal = 'exp' AND key LIKE 'p-%';

-- Back to run: cleanup deletes expired keys again (the tombstones stay until they go).
SELECT idempotency.set_expiry_policy(action, 'run') FROM idempotency.expiry_policies;
SELECT count(*) AS policies FROM idempotency.expiry_policies;
BEGIN;
SELECT outcome FROM idempotency.begin('exp', 'k-run', 'pay', efp('r'));
SELECT idempotency.complete('exp', 'k-run', 201);
COMMIT;
SELECT expire('k-run');
SELECT deleted FROM idempotency.cleanup_batch(1000);
SELECT key, state FROM idempotency.keys WHERE principal = 'exp' ORDER BY key;
DELETE FROM idempotency.keys WHERE principal = 'exp';
-- The helper depends on the extension's type (the upgrade tests drop the extension).
DROP FUNCTION shown(idempotency.key_outcome, text);
