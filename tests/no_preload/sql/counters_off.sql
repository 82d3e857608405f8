-- Without idempotency in shared_preload_libraries there are no counters:
-- idempotency.stats says so (WARNING with a HINT) and shows no rows,
-- stats_reset() returns NULL, and every other function works as before.
SHOW shared_preload_libraries;
\set VERBOSITY default
SELECT database, action, begin_started, stats_reset FROM idempotency.stats;
SELECT idempotency.stats_reset();
\set VERBOSITY sqlstate
SET client_min_messages = error;
SELECT count(*) AS counted_rows FROM idempotency.stats;
RESET client_min_messages;

-- The protocol, counted nowhere.
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'off-1', 'order', idempotency.fingerprint('POST', '/o'));
SELECT idempotency.complete('p', 'off-1', status => 201);
COMMIT;
SELECT outcome FROM idempotency.begin('p', 'off-1', 'order', idempotency.fingerprint('POST', '/o'));
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'off-2', 'order', idempotency.fingerprint('POST', '/o'));
COMMIT;
SELECT idempotency.save_final('p', 'off-3', 'order', idempotency.fingerprint('POST', '/o'), 422) AS saved;
SELECT fence AS f FROM idempotency.acquire('p', 'off-4', 'charge', idempotency.fingerprint('POST', '/c')) \gset
SELECT idempotency.renew('p', 'off-4', :f) AS renewed, idempotency.renew('p', 'off-4', :f + 1000) AS stale;
SELECT idempotency.release('p', 'off-4', :f) AS released;
SELECT action, released, live FROM idempotency.abandoned;
SELECT outcome FROM idempotency.acquire('p', 'off-4', 'charge', idempotency.fingerprint('POST', '/c'));
SELECT count(*) AS abandoned_after_takeover FROM idempotency.abandoned;
UPDATE idempotency.keys SET expires_at = now() - interval '1 hour', created_at = now() - interval '2 hours'
 WHERE key = 'off-1';
SELECT deleted FROM idempotency.cleanup_batch(10, NULL);
