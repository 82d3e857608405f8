-- The findings from outside on 0.8.0 (issue 33), each of which 0.8.0 got wrong:
-- (1) a late fenced completion of a dead key, (2) set_expiry_policy's checks,
-- (3) one UUID in two cases, (4) header values with control characters. The
-- suite runs with and without the library preloaded and in the distributed
-- mode: the answers must be the same.
\set VERBOSITY sqlstate
CREATE FUNCTION f80(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/pay', convert_to(t, 'UTF8')) $$;
-- Moves a key's times into the past, as if `ago` had passed since acquire:
-- the same as sleeping, without making the suite wait.
CREATE FUNCTION age_key(k text, ago interval) RETURNS void LANGUAGE sql AS $$
    UPDATE idempotency.keys SET created_at = created_at - ago, expires_at = expires_at - ago,
                                lease_until = lease_until - ago
     WHERE principal = 'f80' AND key = k;
$$;
CREATE TABLE f80_fence (key text PRIMARY KEY, fence bigint);

-- (1) A late fenced completion of a key whose ttl and lease have both run out
-- is refused, as renew refuses it, under both expiry policies; the key then
-- answers as before the call (expired, or started), never replay.
SELECT idempotency.set_expiry_policy('pay80', 'refuse', '1 hour');
INSERT INTO f80_fence SELECT 'late-refuse', fence
  FROM idempotency.acquire('f80', 'late-refuse', 'pay80', f80('a'), lease => '1 s', ttl => '1 s');
SELECT age_key('late-refuse', '1.3 s');
BEGIN;
SELECT outcome FROM idempotency.begin('f80', 'late-refuse', 'pay80', f80('a'));
ROLLBACK;
SELECT idempotency.renew('f80', 'late-refuse', (SELECT fence FROM f80_fence WHERE key = 'late-refuse'));
SELECT idempotency.complete('f80', 'late-refuse', 200, 'late',
                            fence => (SELECT fence FROM f80_fence WHERE key = 'late-refuse'));
SELECT idempotency.release('f80', 'late-refuse', (SELECT fence FROM f80_fence WHERE key = 'late-refuse'));
BEGIN;
SELECT outcome FROM idempotency.begin('f80', 'late-refuse', 'pay80', f80('a'));
ROLLBACK;
SELECT state, response_status FROM idempotency.keys WHERE principal = 'f80' AND key = 'late-refuse';
-- The same under the default policy (run): the dead key starts again.
INSERT INTO f80_fence SELECT 'late-run', fence
  FROM idempotency.acquire('f80', 'late-run', 'run80', f80('a'), lease => '1 s', ttl => '1 s');
SELECT age_key('late-run', '1.3 s');
SELECT idempotency.complete('f80', 'late-run', 200, 'late',
                            fence => (SELECT fence FROM f80_fence WHERE key = 'late-run'));
BEGIN;
SELECT outcome FROM idempotency.begin('f80', 'late-run', 'run80', f80('a'));
ROLLBACK;
-- Still accepted while the row is live: the ttl ran out but the lease holds
-- (the lease keeps the key), or the lease ran out but the ttl holds and nobody
-- took the key over (renew says true too).
INSERT INTO f80_fence SELECT 'lease-holds', fence
  FROM idempotency.acquire('f80', 'lease-holds', 'pay80', f80('a'), lease => '1 h', ttl => '1 s');
SELECT age_key('lease-holds', '1.3 s');
SELECT idempotency.complete('f80', 'lease-holds', 201, 'kept',
                            fence => (SELECT fence FROM f80_fence WHERE key = 'lease-holds'));
SELECT outcome, response_status FROM idempotency.begin('f80', 'lease-holds', 'pay80', f80('a'));
INSERT INTO f80_fence SELECT 'ttl-holds', fence
  FROM idempotency.acquire('f80', 'ttl-holds', 'pay80', f80('a'), lease => '1 s', ttl => '1 h');
SELECT age_key('ttl-holds', '1.3 s');
SELECT idempotency.renew('f80', 'ttl-holds', (SELECT fence FROM f80_fence WHERE key = 'ttl-holds'));
SELECT idempotency.complete('f80', 'ttl-holds', 201, 'kept',
                            fence => (SELECT fence FROM f80_fence WHERE key = 'ttl-holds'));
SELECT outcome, response_status FROM idempotency.begin('f80', 'ttl-holds', 'pay80', f80('a'));
SELECT idempotency.set_expiry_policy('pay80', 'run');

-- (2) set_expiry_policy refuses what the calls it governs refuse: an empty or
-- over-long action (begin's check) and a grace beyond 366 days on the
-- timestamps it gives (the ttl's check: 12 months and 6 days are 371 days,
-- although interval comparison counts a month as 30).
SELECT idempotency.set_expiry_policy('pay80', 'refuse', '12 mon 6 days');
SELECT idempotency.set_expiry_policy('pay80', 'refuse', '367 days');
SELECT idempotency.set_expiry_policy('pay80', 'refuse', '0');
SELECT idempotency.set_expiry_policy('pay80', 'refuse', '-1 day');
SELECT idempotency.set_expiry_policy('pay80', 'refuse', NULL);
SELECT idempotency.set_expiry_policy('', 'refuse', '1 day');
SELECT idempotency.set_expiry_policy(repeat('a', 2000), 'refuse', '1 day');
SELECT idempotency.set_expiry_policy(repeat('a', 2000), 'run');
SELECT idempotency.set_expiry_policy(NULL, 'refuse', '1 day');
SELECT count(*) AS no_policy_stored FROM idempotency.expiry_policies WHERE action IN ('', 'pay80')
    OR length(action) > 1024;
-- The limits themselves are accepted, as for a ttl.
SELECT idempotency.set_expiry_policy('pay80', 'refuse', '366 days');
SELECT idempotency.set_expiry_policy(repeat('a', 1024), 'refuse', '1 microsecond');
SELECT action = 'pay80' OR length(action) = 1024 AS stored, grace FROM idempotency.expiry_policies
 WHERE action = 'pay80' OR length(action) = 1024 ORDER BY grace;
SELECT idempotency.set_expiry_policy('pay80', 'run');
SELECT idempotency.set_expiry_policy(repeat('a', 1024), 'run');
-- Only set_expiry_policy calls the check; nobody else may.
SELECT has_function_privilege('public', 'idempotency.check_expiry_policy(text, interval)', 'execute')
    AS public_may_check;

-- (3) One UUID, one spelling: with key_format uuid or uuidv7, upper-case digits
-- are refused (22P02, HTTP 400), so a client that upper-cases never runs a
-- request a second time under the other spelling.
SET idempotency.key_format = 'uuidv7';
BEGIN;
SELECT outcome FROM idempotency.begin('f80', '018f3e5c-7a1b-7c2d-8e3f-0123456789ab', 'pay80', f80('a'));
SELECT idempotency.complete('f80', '018f3e5c-7a1b-7c2d-8e3f-0123456789ab', 201, 'one');
COMMIT;
SELECT outcome FROM idempotency.begin('f80', '018F3E5C-7A1B-7C2D-8E3F-0123456789AB', 'pay80', f80('a'));
SELECT outcome FROM idempotency.begin('f80', '018f3e5c-7a1b-7c2d-8E3f-0123456789ab', 'pay80', f80('a'));
SELECT outcome FROM idempotency.acquire('f80', '018F3E5C-7A1B-7C2D-8E3F-0123456789AB', 'pay80', f80('a'));
SELECT idempotency.claim('f80', '018F3E5C-7A1B-7C2D-8E3F-0123456789AB');
SELECT idempotency.save_final('f80', '018F3E5C-7A1B-7C2D-8E3F-0123456789AB', 'pay80', f80('a'), 404);
SELECT count(*) FROM idempotency.begin_batch('f80', ARRAY['018F3E5C-7A1B-7C2D-8E3F-0123456789AB'],
                                             'pay80', ARRAY[f80('a')]);
SET idempotency.key_format = 'uuid';
SELECT outcome FROM idempotency.begin('f80', '018F3E5C-7A1B-7C2D-8E3F-0123456789AB', 'pay80', f80('a'));
SELECT outcome FROM idempotency.begin('f80', '018f3e5c-7a1b-7c2d-8e3f-0123456789ab', 'pay80', f80('a'));
-- any keeps keys opaque: another spelling is another key.
RESET idempotency.key_format;
BEGIN;
SELECT outcome FROM idempotency.begin('f80', '018F3E5C-7A1B-7C2D-8E3F-0123456789AB', 'pay80', f80('a'));
ROLLBACK;
SELECT count(*) AS one_key FROM idempotency.keys WHERE principal = 'f80' AND lower(key) = key
   AND key LIKE '018f3e5c%';

-- (4) Stored header values are RFC 9110 field values: visible ASCII, SP, HTAB
-- and U+0080..U+00FF (obs-text, as Latin-1); other controls, DEL and
-- characters above U+00FF are refused (22023) by every call that stores them.
BEGIN;
SELECT outcome FROM idempotency.begin('f80', 'h-ok', 'pay80', f80('a'));
SELECT idempotency.complete('f80', 'h-ok', 201, 'ok',
       jsonb_build_object('ETag', E'"a\tb c"', 'X-Latin', 'café ÿ ', 'X-High', E'\u0080'));
COMMIT;
SELECT response_headers FROM idempotency.begin('f80', 'h-ok', 'pay80', f80('a'));
BEGIN;
SELECT outcome FROM idempotency.begin('f80', 'h-bad', 'pay80', f80('a'));
SAVEPOINT s;
SELECT idempotency.complete('f80', 'h-bad', 201, 'x', jsonb_build_object('X-A', E'a\u0001b'));
ROLLBACK TO s;
SELECT idempotency.complete('f80', 'h-bad', 201, 'x', jsonb_build_object('X-A', E'a\u007fb'));
ROLLBACK TO s;
SELECT idempotency.complete('f80', 'h-bad', 201, 'x', jsonb_build_object('X-A', E'\u001f'));
ROLLBACK TO s;
SELECT idempotency.complete('f80', 'h-bad', 201, 'x', jsonb_build_object('X-A', E'a\u0100'));
ROLLBACK TO s;
SELECT idempotency.complete('f80', 'h-bad', 201, 'x', jsonb_build_object('X-A', '20 €'));
ROLLBACK TO s;
SELECT idempotency.complete('f80', 'h-bad', 201, 'x', jsonb_build_object('X-A', E'a\nb'));
ROLLBACK TO s;
SELECT idempotency.complete('f80', 'h-bad', 201, 'x', jsonb_build_array(jsonb_build_array('X-A', E'\u0007')));
ROLLBACK;
SELECT idempotency.save_final('f80', 'h-bad', 'pay80', f80('a'), 404, 'nf',
                              jsonb_build_object('X-A', E'\u0001'));
BEGIN;
SELECT outcome FROM idempotency.begin_batch('f80', ARRAY['h-b1'], 'pay80', ARRAY[f80('a')]);
SELECT * FROM idempotency.complete_batch('f80', ARRAY['h-b1'], ARRAY[201], ARRAY['x'::bytea],
                                         ARRAY[jsonb_build_object('X-A', E'\u007f')]);
ROLLBACK;
-- Nothing of the refused calls was stored.
SELECT count(*) AS refused_stored FROM idempotency.keys WHERE principal = 'f80' AND key IN ('h-bad', 'h-b1');

DELETE FROM idempotency.keys WHERE principal = 'f80';
DROP TABLE f80_fence;
DROP FUNCTION age_key(text, interval);
DROP FUNCTION f80(text);
