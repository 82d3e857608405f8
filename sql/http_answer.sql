-- idempotency.http_answer (0.9.0): the whole HTTP answer of every outcome that
-- does not run the handler, from the outcome that begin, acquire or
-- begin_batch returned. The bytes are those 0.8.0's C++ client built itself;
-- every client now sends them as they are (client/cpp/tests/http_answer_test.cpp,
-- tests/conformance/vectors.json for every example service).
\set VERBOSITY sqlstate
CREATE FUNCTION fph(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/h', convert_to(t, 'UTF8')) $$;
-- An answer as text: its status, its headers without the expiry (whose value
-- changes with the clock; expiry_ok says it is the key's own expiry as an
-- IMF-fixdate), its body as text.
CREATE FUNCTION shown(o idempotency.key_outcome,
                      OUT status integer, OUT headers jsonb, OUT body text, OUT expiry_ok boolean)
    LANGUAGE sql AS $$
    SELECT a.status,
           (SELECT jsonb_agg(p ORDER BY n) FROM jsonb_array_elements(a.headers) WITH ORDINALITY AS e(p, n)
             WHERE p ->> 0 <> 'Idempotency-Expires'),
           convert_from(a.body, 'UTF8'),
           (SELECT count(*) = 1 AND bool_and(p ->> 1 = to_char(o.expires_at AT TIME ZONE 'UTC',
                                                               'Dy, DD Mon YYYY HH24:MI:SS "GMT"'))
              FROM jsonb_array_elements(a.headers) AS e(p) WHERE p ->> 0 = 'Idempotency-Expires')
      FROM idempotency.http_answer(o) AS a
$$;

-- started: no answer yet, the handler runs.
BEGIN;
SELECT * FROM shown(idempotency.begin('h', 'k1', 'pay', fph('a')));
SELECT idempotency.complete('h', 'k1', 201, convert_to('{"id":1}', 'UTF8'),
                            '[["Content-Type", "application/json"], ["Location", "/o/1"]]');
COMMIT;
-- replay: the stored status, kept headers and body; the marker; the expiry.
BEGIN;
SELECT * FROM shown(idempotency.begin('h', 'k1', 'pay', fph('a')));
-- mismatch: 422.
SELECT * FROM shown(idempotency.begin('h', 'k1', 'pay', fph('b')));
ROLLBACK;

-- secret_replay: 409 one-time-secret, a replay (nothing of the secret is kept).
BEGIN;
SELECT outcome FROM idempotency.begin('h', 'k2', 'pay', fph('a'));
SELECT idempotency.complete('h', 'k2', 201, convert_to('{"secret":"s"}', 'UTF8'), one_time_secret => true);
COMMIT;
BEGIN;
SELECT * FROM shown(idempotency.begin('h', 'k2', 'pay', fph('a')));
ROLLBACK;

-- A stream past the service's limit (":not_kept"): 409 response-not-kept, a replay.
BEGIN;
SELECT outcome FROM idempotency.begin('h', 'k3', 'pay', fph('a'));
SELECT idempotency.complete('h', 'k3', 200, NULL, '[[":not_kept", "stream-too-large"]]');
COMMIT;
BEGIN;
SELECT * FROM shown(idempotency.begin('h', 'k3', 'pay', fph('a')));
ROLLBACK;
-- A kept stream: ":chunks" stays in its place for the client (chunk lengths, not a header).
BEGIN;
SELECT outcome FROM idempotency.begin('h', 'k4', 'pay', fph('a'));
SELECT idempotency.complete('h', 'k4', 200, convert_to('abcde', 'UTF8'),
                            '[["Content-Type", "text/plain"], [":chunks", "2,3"]]');
COMMIT;
BEGIN;
SELECT * FROM shown(idempotency.begin('h', 'k4', 'pay', fph('a')));
ROLLBACK;

-- in_progress under a lease: Retry-After is when the lease runs out (ceil, at least 1).
SELECT outcome FROM idempotency.acquire('h', 'k5', 'pay', fph('a'), lease => '30 s');
SELECT (shown(o)).status, (shown(o)).headers -> 0 AS content_type,
       ((shown(o)).headers -> 1 ->> 0) AS name, ((shown(o)).headers -> 1 ->> 1)::int BETWEEN 28 AND 30 AS lease_left,
       (shown(o)).body, (shown(o)).expiry_ok
  FROM idempotency.acquire('h', 'k5', 'pay', fph('a'), wait => '0') AS o;

-- expired (a tombstone under on_expiry 'refuse'): 410 with the past expiry.
SELECT idempotency.set_expiry_policy('pay-refuse', 'refuse', '1 hour');
BEGIN;
SELECT outcome FROM idempotency.begin('h', 'k6', 'pay-refuse', fph('a'), ttl => '1 s');
SELECT idempotency.complete('h', 'k6', 201, convert_to('{}', 'UTF8'));
COMMIT;
UPDATE idempotency.keys SET created_at = created_at - interval '1 minute',
                            expires_at = expires_at - interval '1 minute'
 WHERE principal = 'h' AND key = 'k6';
SELECT deleted >= 1 AS cleaned FROM idempotency.cleanup_batch(100);
SELECT state FROM idempotency.keys WHERE principal = 'h' AND key = 'k6';
BEGIN;
SELECT * FROM shown(idempotency.begin('h', 'k6', 'pay-refuse', fph('a')));
ROLLBACK;

-- begin_batch rows have an answer of their own (replay, mismatch, started).
BEGIN;
SELECT b.ord, b.key, a.status, a.headers - -1 AS headers, convert_from(a.body, 'UTF8') AS body
  FROM idempotency.begin_batch('h', ARRAY['k1', 'k2', 'k7'], 'pay',
                               ARRAY[fph('a'), fph('z'), fph('a')]) AS b,
       idempotency.http_answer(b) AS a
 ORDER BY b.ord;
ROLLBACK;

-- Rows made by hand: the date as an IMF-fixdate in GMT whatever the session's
-- TimeZone and lc_time; Retry-After without a lease from retry_after (at least
-- 1); the object form of 0.1.0-0.5.0 in byte order; pairs that are not two
-- strings skipped; a stored marker or expiry replaced by the answer's own; a
-- type base escaped as JSON; a replay with no body has an empty one.
SET TimeZone = 'America/New_York';
SET lc_time = 'C';
SELECT status, headers, convert_from(body, 'UTF8') AS body FROM idempotency.http_answer(
    ROW('expired', NULL, NULL, NULL, NULL, NULL, '2026-03-01 04:05:06.999+00', NULL, NULL)::idempotency.key_outcome);
SELECT headers FROM idempotency.http_answer(
    ROW('in_progress', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome, retry_after => 7);
SELECT headers FROM idempotency.http_answer(
    ROW('in_progress', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome, retry_after => 0);
SELECT headers FROM idempotency.http_answer(
    ROW('in_progress', NULL, NULL, NULL, NULL, NULL, NULL, NULL, now() - interval '1 hour')::idempotency.key_outcome);
SELECT status, headers, body FROM idempotency.http_answer(
    ROW('replay', 200, '{"b": "2", "a": "1", "B": "3", "n": 4}', NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome);
SELECT status, headers, body FROM idempotency.http_answer(
    ROW('replay', 204, '[["ETag", "\"x\""], ["idempotent-replay", "false"], ["A", 1], ["B"], "C",
                        ["IDEMPOTENCY-EXPIRES", "then"], ["ETag", "\"y\""]]',
        NULL, NULL, NULL, '2026-12-31 23:59:59+00', NULL, NULL)::idempotency.key_outcome);
SELECT status, headers, body FROM idempotency.http_answer(
    ROW('replay', 200, '"not headers"', '\x00ff', NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome);
SELECT convert_from(body, 'UTF8') FROM idempotency.http_answer(
    ROW('mismatch', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome,
    type_base => 'https://errors.example/"q"\é/');
RESET TimeZone;
RESET lc_time;

-- Bad input: a clear SQLSTATE, never a guess.
SELECT * FROM idempotency.http_answer(ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome);
SELECT * FROM idempotency.http_answer(NULL::idempotency.key_outcome);
SELECT * FROM idempotency.http_answer(ROW('replayed', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome);
SELECT * FROM idempotency.http_answer(ROW('mismatch', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome, NULL);
SELECT * FROM idempotency.http_answer(ROW('mismatch', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_outcome, retry_after => NULL);

-- What a handler's status means for storage: one table, which follows
-- idempotency.final_statuses as is_final does.
SELECT s, idempotency.http_storage(s)
  FROM unnest(ARRAY[100, 200, 201, 204, 301, 304, 400, 401, 403, 404, 409, 410, 412, 413, 415, 422,
                    428, 429, 500, 503, 599]) AS s;
SET idempotency.final_statuses = '2xx,404,503';
SELECT s, idempotency.http_storage(s) FROM unnest(ARRAY[201, 400, 404, 503]) AS s;
RESET idempotency.final_statuses;
SELECT idempotency.http_storage(99);
SELECT idempotency.http_storage(600);
SELECT idempotency.http_storage(NULL);

-- Anyone may call it (it reads nothing): PUBLIC executes it, as jcs and fingerprint.
SELECT has_function_privilege('public', 'idempotency.http_answer(idempotency.key_outcome, text, integer)', 'EXECUTE');
SELECT has_function_privilege('public', 'idempotency.http_answer(idempotency.batch_outcome, text, integer)', 'EXECUTE');
SELECT has_function_privilege('public', 'idempotency.http_storage(integer)', 'EXECUTE');

SELECT idempotency.set_expiry_policy('pay-refuse', 'run');
DELETE FROM idempotency.keys WHERE principal = 'h';
DROP FUNCTION shown(idempotency.key_outcome);
DROP FUNCTION fph(text);
