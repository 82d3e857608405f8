-- Edge cases where 0.5.0 broke a promise (issue 11, section 1), one block each.
\set VERBOSITY sqlstate
CREATE FUNCTION g_fp(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/g', convert_to(t, 'UTF8')) $$;

-- 1. Fences never repeat for a key, after cleanup or forget deleted its row.
SELECT fence AS first_fence FROM idempotency.acquire('p', 'g-1', 'charge', g_fp('{}'), lease => '100 ms', ttl => '100 ms') \gset
SELECT pg_sleep(0.15);
CALL idempotency.cleanup();
SELECT count(*) AS rows_left FROM idempotency.keys WHERE key = 'g-1';
SELECT outcome, fence > :first_fence AS higher_fence
  FROM idempotency.acquire('p', 'g-1', 'charge', g_fp('{}'), lease => '10 min') \gset second_
SELECT :'second_outcome' AS outcome, :'second_higher_fence' AS higher_fence;
-- The stalled first holder is fenced out for good.
SELECT idempotency.renew('p', 'g-1', :first_fence) AS stale_renew,
       idempotency.complete('p', 'g-1', 200, convert_to('stale', 'UTF8'), fence => :first_fence) AS stale_complete,
       idempotency.release('p', 'g-1', :first_fence) AS stale_release;
SELECT fence AS second_fence FROM idempotency.keys WHERE key = 'g-1' \gset
SELECT idempotency.forget('p', 'g-1') AS forgotten;
SELECT fence > :second_fence AS higher_after_forget
  FROM idempotency.acquire('p', 'g-1', 'charge', g_fp('{}'), lease => '10 min');
SELECT idempotency.renew('p', 'g-1', :second_fence) AS forgotten_holder_renews;
-- begin and claim draw from the same sequence.
BEGIN;
SELECT fence > :second_fence AS begin_fence_higher FROM idempotency.begin('p', 'g-1b', 'a', g_fp('{}'));
SELECT idempotency.complete('p', 'g-1b', 201);
COMMIT;

-- 1b. A lease longer than the key's ttl keeps the row alive while it lasts:
-- cleanup leaves it, every entry point sees it held, and its holder can renew
-- and complete; the completed key is then kept for one more ttl.
SELECT fence AS long_fence FROM idempotency.acquire('p', 'g-long', 'charge', g_fp('{}'), lease => '10 min', ttl => '100 ms') \gset
SELECT pg_sleep(0.15);
CALL idempotency.cleanup();
SELECT state, live, fence = :long_fence AS same_fence FROM idempotency.lookup('p', 'g-long');
SELECT outcome FROM idempotency.acquire('p', 'g-long', 'charge', g_fp('{}'), wait => '0');
SELECT outcome FROM idempotency.acquire('p', 'g-long', 'charge', g_fp('{"other":1}'), wait => '0');
SELECT idempotency.save_final('p', 'g-long', 'charge', g_fp('{"other":1}'), 422) AS save_final_refused;
SELECT idempotency.claim('p', 'g-long') AS claim_refused;
SELECT idempotency.renew('p', 'g-long', :long_fence) AS renewed_past_ttl;
SELECT idempotency.complete('p', 'g-long', 201, convert_to('late', 'UTF8'), fence => :long_fence) AS completed;
SELECT expires_at > now() AS kept_again, expires_at - now() <= interval '100 ms' AS for_one_ttl
  FROM idempotency.keys WHERE key = 'g-long';
SELECT outcome, convert_from(response_body, 'UTF8') AS body
  FROM idempotency.acquire('p', 'g-long', 'charge', g_fp('{}'));

-- 1c. A lease completed within its key's ttl keeps the expiry acquire gave it
-- (and told the caller); only a completion after the ttl ran out moves it (1b).
SELECT fence AS in_ttl_fence FROM idempotency.acquire('p', 'g-in-ttl', 'charge', g_fp('{}'), ttl => '1 hour') \gset
SELECT expires_at AS in_ttl_expiry FROM idempotency.keys WHERE key = 'g-in-ttl' \gset
SELECT pg_sleep(0.01);
SELECT idempotency.complete('p', 'g-in-ttl', 201, fence => :in_ttl_fence) AS completed_in_ttl;
SELECT state, expires_at = :'in_ttl_expiry' AS kept_acquire_expiry FROM idempotency.keys WHERE key = 'g-in-ttl';

-- 3. One mismatch rule for every entry point: a lapsed lease of a live key
-- is not taken over by save_final with another fingerprint.
SELECT fence AS lapsed_fence FROM idempotency.acquire('p', 'g-3', 'charge', g_fp('{"a":1}'), lease => '100 ms') \gset
SELECT pg_sleep(0.15);
SELECT idempotency.save_final('p', 'g-3', 'charge', g_fp('{"a":2}'), 422, convert_to('other', 'UTF8')) AS other_request_stored;
SELECT state, fence = :lapsed_fence AS untouched FROM idempotency.keys WHERE key = 'g-3';
SELECT outcome FROM idempotency.acquire('p', 'g-3', 'charge', g_fp('{"a":2}'));
-- The same request may store its final error over its own lapsed lease.
SELECT idempotency.save_final('p', 'g-3', 'charge', g_fp('{"a":1}'), 422, convert_to('own', 'UTF8')) AS own_request_stored;
SELECT outcome, convert_from(response_body, 'UTF8') AS body, fence > :lapsed_fence AS higher_fence
  FROM idempotency.begin('p', 'g-3', 'charge', g_fp('{"a":1}'));

-- 6. Input bounds.
SELECT idempotency.claim('p', 'key' || U&'\0085' || 'x');
SELECT idempotency.claim('p', 'key' || U&'\009F');
SELECT idempotency.claim('p', 'key' || U&'\00A0') AS nbsp_is_fine;
SELECT idempotency.claim('', 'k');
SELECT idempotency.begin('p', 'k', 'a', g_fp('{}'), ttl => '0');
SELECT idempotency.begin('p', 'k', 'a', g_fp('{}'), ttl => '367 days');
SELECT idempotency.begin('p', 'k', 'a', g_fp('{}'), ttl => '-178000000 years');
SELECT idempotency.save_final('p', 'k', 'a', g_fp('{}'), 422, ttl => '2147483647 months');

-- 9. release answers false once the lease has run out; save_final keeps no
-- body or headers of a one-time secret.
SELECT fence AS rel_fence FROM idempotency.acquire('p', 'g-9', 'charge', g_fp('{}'), lease => '100 ms') \gset
SELECT pg_sleep(0.15);
SELECT idempotency.release('p', 'g-9', :rel_fence) AS release_after_lapse;
SELECT idempotency.save_final('p', 'g-9s', 'a', g_fp('{}'), 403, convert_to('sk_live', 'UTF8'),
                              '{"X-Key":"sk_live"}', one_time_secret => true) AS stored;
SELECT response_status, response_body, response_headers, one_time_secret FROM idempotency.keys WHERE key = 'g-9s';
SELECT outcome, response_status, response_body FROM idempotency.begin('p', 'g-9s', 'a', g_fp('{}'));

-- 8. principal_binding: a role acts only for the principal that is its name.
-- (Not in the trusted edition's run, which cannot bind principals per session:
-- tests/trusted/guarantees.sed leaves out from here to DROP ROLE g_bob.)
CREATE ROLE g_alice;
CREATE ROLE g_bob;
GRANT USAGE ON SCHEMA idempotency TO g_alice, g_bob;
GRANT EXECUTE ON FUNCTION idempotency.begin(text, text, text, bytea, interval, interval),
                          idempotency.complete(text, text, integer, bytea, jsonb, text, boolean, bigint),
                          idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval, boolean),
                          idempotency.acquire(text, text, text, bytea, interval, interval, interval),
                          idempotency.renew(text, text, bigint, interval),
                          idempotency.release(text, text, bigint),
                          idempotency.claim(text, text, interval),
                          idempotency.forget(text, text),
                          idempotency.lookup(text, text),
                          idempotency.fingerprint(text, text, bytea, text[]) TO g_alice;
SET idempotency.principal_binding = 'current_user';
SET ROLE g_alice;
SET idempotency.principal_binding = off;
BEGIN;
SELECT outcome FROM idempotency.begin('g_bob', 'b-1', 'a', g_fp('{}'));
ROLLBACK;
SELECT idempotency.save_final('g_bob', 'b-1', 'a', g_fp('{}'), 422);
SELECT idempotency.acquire('g_bob', 'b-1', 'a', g_fp('{}'));
SELECT idempotency.renew('g_bob', 'b-1', 1);
SELECT idempotency.complete('g_bob', 'b-1', 200, fence => 1);
SELECT idempotency.release('g_bob', 'b-1', 1);
SELECT idempotency.claim('g_bob', 'b-1');
SELECT idempotency.forget('g_bob', 'b-1');
SELECT * FROM idempotency.lookup('g_bob', 'b-1');
-- Its own principal works everywhere.
BEGIN;
SELECT outcome FROM idempotency.begin('g_alice', 'a-1', 'a', g_fp('{}'));
SELECT idempotency.complete('g_alice', 'a-1', 201);
COMMIT;
SELECT fence AS alice_fence FROM idempotency.acquire('g_alice', 'a-2', 'a', g_fp('{}')) \gset
SELECT idempotency.renew('g_alice', 'a-2', :alice_fence) AS renewed,
       idempotency.release('g_alice', 'a-2', :alice_fence) AS released,
       idempotency.claim('g_alice', 'a-3') AS claimed,
       idempotency.save_final('g_alice', 'a-4', 'a', g_fp('{}'), 422) AS saved,
       (SELECT state FROM idempotency.lookup('g_alice', 'a-1')) AS looked_up,
       idempotency.forget('g_alice', 'a-1') AS forgotten;
RESET ROLE;
SET ROLE g_bob;
SELECT idempotency.bound_principal('g_alice');
SELECT idempotency.bound_principal('g_bob') AS bob_is_bob;
RESET ROLE;
RESET idempotency.principal_binding;
SELECT idempotency.bound_principal('anyone') AS unbound;
-- A key begun by a role that may (here the owner, binding off) is not completed
-- after SET ROLE to a bound role that may not act for its principal.
BEGIN;
SELECT outcome FROM idempotency.begin('g_bob', 'b-2', 'a', g_fp('{}'));
SET LOCAL idempotency.principal_binding = 'current_user';
SET LOCAL ROLE g_alice;
SELECT idempotency.complete('g_bob', 'b-2', 201);
ROLLBACK;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA idempotency FROM g_alice;
REVOKE USAGE ON SCHEMA idempotency FROM g_alice, g_bob;
DROP ROLE g_alice;
DROP ROLE g_bob;

DELETE FROM idempotency.keys;
DROP FUNCTION g_fp(text);
