-- The transactional protocol: begin / complete / save_final / is_final / forget.
\set VERBOSITY sqlstate
-- Fences come from the clock: the file shows them by name, 1, 2, 3... in the order they appear.
\i sql/include/fence_names.psql
CREATE TABLE orders (id serial PRIMARY KEY, note text);
CREATE FUNCTION fp(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/orders', convert_to(t, 'UTF8')) $$;

-- started: a new key; the handler's write and the key row commit together.
BEGIN;
SELECT outcome, response_status, response_body, pg_temp.fence_no(fence) AS fence, expires_at - created_at AS ttl
  FROM idempotency.begin('alice', 'k-1', 'create_order', fp('{"item":"book"}'));
INSERT INTO orders (note) VALUES ('book');
SELECT idempotency.complete('alice', 'k-1', 201, convert_to('{"id":1}', 'UTF8'),
                            '{"Location":"/orders/1","Content-Type":"application/json"}', 'order-1');
COMMIT;

-- replay: the same request again, byte for byte, with the kept headers.
SELECT outcome, response_status, response_headers, convert_from(response_body, 'UTF8') AS body, resource_id,
       pg_temp.fence_no(fence) AS fence
  FROM idempotency.begin('alice', 'k-1', 'create_order', fp('{ "item" : "book" }'));
-- mismatch: another request under the same key (the stored body is not exposed).
SELECT outcome, response_status, response_body IS NULL AS no_body, resource_id
  FROM idempotency.begin('alice', 'k-1', 'create_order', fp('{"item":"pen"}'));
-- keys never cross principals.
BEGIN;
SELECT outcome FROM idempotency.begin('bob', 'k-1', 'create_order', fp('{"item":"pen"}'));
SELECT idempotency.complete('bob', 'k-1', 201, convert_to('{"id":2}', 'UTF8'));
COMMIT;
SELECT principal, key, action, state, response_status, resource_id, one_time_secret, pg_temp.fence_no(fence) AS fence,
       lease_until
  FROM idempotency.keys ORDER BY principal;

-- secret_replay: a response with a secret is not stored, only its status and the marker.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-secret', 'create_api_key', fp('{}'));
SELECT idempotency.complete('alice', 'k-secret', 201, convert_to('{"secret":"s3cr3t"}', 'UTF8'),
                            '{"X-Secret":"s3cr3t"}', one_time_secret => true);
COMMIT;
SELECT response_status, response_body, response_headers, one_time_secret
  FROM idempotency.keys WHERE key = 'k-secret';
SELECT outcome, response_status, response_body FROM idempotency.begin('alice', 'k-secret', 'create_api_key', fp('{}'));

-- A rolled-back attempt stores nothing: the retry starts again.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-rollback', 'create_order', fp('{}'));
INSERT INTO orders (note) VALUES ('rolled back');
ROLLBACK;
SELECT count(*) AS keys FROM idempotency.keys WHERE key = 'k-rollback';
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-rollback', 'create_order', fp('{}'));
ROLLBACK;

-- Committing a started key without complete is refused (55000), and nothing
-- commits; in autocommit too.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-forgot', 'create_order', fp('{}'));
INSERT INTO orders (note) VALUES ('must not commit');
COMMIT;
SELECT count(*) AS leaked FROM orders WHERE note = 'must not commit';
SELECT outcome FROM idempotency.begin('alice', 'k-autocommit', 'create_order', fp('{}'));
SELECT count(*) AS keys FROM idempotency.keys WHERE key = 'k-autocommit';

-- complete without begin in this transaction: 55000; twice: 55000.
SELECT idempotency.complete('alice', 'k-none', 201);
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-twice', 'create_order', fp('{}'));
SELECT idempotency.complete('alice', 'k-twice', 201);
SELECT idempotency.complete('alice', 'k-twice', 201);
ROLLBACK;
-- begin twice for the same started key in one transaction: 55000.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-twice', 'create_order', fp('{}'));
SELECT outcome FROM idempotency.begin('alice', 'k-twice', 'create_order', fp('{}'));
ROLLBACK;
-- begin, complete, begin again in one transaction: the transaction sees its own row.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-own', 'create_order', fp('{}'));
SELECT idempotency.complete('alice', 'k-own', 200, convert_to('ok', 'UTF8'));
SELECT outcome, convert_from(response_body, 'UTF8') AS body FROM idempotency.begin('alice', 'k-own', 'create_order', fp('{}'));
ROLLBACK;

-- Savepoints: a begin inside a rolled-back savepoint is forgotten with it, so
-- the commit is allowed and stores nothing; a complete inside one is undone.
BEGIN;
SAVEPOINT s1;
SELECT outcome FROM idempotency.begin('alice', 'k-sp', 'create_order', fp('{}'));
ROLLBACK TO SAVEPOINT s1;
COMMIT;
SELECT count(*) AS keys FROM idempotency.keys WHERE key = 'k-sp';
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-sp', 'create_order', fp('{}'));
SAVEPOINT s2;
SELECT idempotency.complete('alice', 'k-sp', 201);
ROLLBACK TO SAVEPOINT s2;
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-sp', 'create_order', fp('{}'));
SAVEPOINT s3;
SELECT idempotency.complete('alice', 'k-sp', 201, convert_to('kept', 'UTF8'));
RELEASE SAVEPOINT s3;
COMMIT;
SELECT outcome, convert_from(response_body, 'UTF8') AS body FROM idempotency.begin('alice', 'k-sp', 'create_order', fp('{}'));

-- complete only stores final statuses.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-500', 'create_order', fp('{}'));
SELECT idempotency.complete('alice', 'k-500', 500);
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-600', 'create_order', fp('{}'));
SELECT idempotency.complete('alice', 'k-600', 600);
ROLLBACK;
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-hdr', 'create_order', fp('{}'));
SELECT idempotency.complete('alice', 'k-hdr', 200, NULL, '["not","an","object"]');
ROLLBACK;

-- is_final follows idempotency.final_statuses.
SELECT s, idempotency.is_final(s) FROM unnest(ARRAY[200, 201, 204, 301, 400, 401, 403, 404, 409, 410, 412,
                                                  413, 415, 422, 428, 429, 500, 503, 99, 600]) AS s;
SET idempotency.final_statuses = '2xx, 5XX ,418';
SELECT idempotency.is_final(418), idempotency.is_final(503), idempotency.is_final(404);
SET idempotency.final_statuses = '2xx,abc';
SET idempotency.final_statuses = '600';
SET idempotency.final_statuses = '6xx';
RESET idempotency.final_statuses;

-- save_final: after a rollback, stores a final error if the key is absent.
SELECT idempotency.save_final('alice', 'k-400', 'create_order', fp('{"bad":1}'), 400,
                              convert_to('{"type":"about:blank","status":400}', 'UTF8'),
                              '{"Content-Type":"application/problem+json"}');
SELECT idempotency.save_final('alice', 'k-400', 'create_order', fp('{"bad":1}'), 400, convert_to('again', 'UTF8'));
SELECT outcome, response_status, convert_from(response_body, 'UTF8') AS body, response_headers
  FROM idempotency.begin('alice', 'k-400', 'create_order', fp('{"bad":1}'));
-- 401, 429 and 5xx are not stored, so a retry after refresh, throttling or a crash runs once.
SELECT s, idempotency.save_final('alice', 'k-' || s, 'create_order', fp('{}'), s) AS stored
  FROM unnest(ARRAY[401, 429, 500, 503]) AS s;
SELECT count(*) AS not_stored FROM idempotency.keys WHERE key IN ('k-401', 'k-429', 'k-500', 'k-503');
-- save_final never overwrites a live key.
SELECT idempotency.save_final('alice', 'k-1', 'create_order', fp('{"item":"book"}'), 409);
SELECT response_status FROM idempotency.keys WHERE principal = 'alice' AND key = 'k-1';
-- save_final inside the transaction that began the key: 55000.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-mixed', 'create_order', fp('{}'));
SELECT idempotency.save_final('alice', 'k-mixed', 'create_order', fp('{}'), 400);
ROLLBACK;

-- Expired keys behave as absent; the next use replaces the row (with a higher fence).
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-ttl', 'create_order', fp('{}'), ttl => '1 millisecond');
SELECT idempotency.complete('alice', 'k-ttl', 201, convert_to('old', 'UTF8'));
COMMIT;
SELECT pg_sleep(0.05);
SELECT fence AS ttl_first_fence FROM idempotency.keys WHERE key = 'k-ttl' \gset
BEGIN;
SELECT outcome, fence > :ttl_first_fence AS higher_fence
  FROM idempotency.begin('alice', 'k-ttl', 'create_order', fp('{"other":"request"}'));
SELECT idempotency.complete('alice', 'k-ttl', 201, convert_to('new', 'UTF8'));
COMMIT;
SELECT convert_from(response_body, 'UTF8') AS body, fence > :ttl_first_fence AS higher_fence,
       expires_at - created_at AS ttl
  FROM idempotency.keys WHERE key = 'k-ttl';
SET idempotency.key_ttl = '2h';
BEGIN;
SELECT expires_at - created_at AS ttl FROM idempotency.begin('alice', 'k-ttl2', 'create_order', fp('{}'));
ROLLBACK;
RESET idempotency.key_ttl;

-- Argument checks.
SELECT idempotency.begin(NULL, 'k', 'a', fp('{}'));
SELECT idempotency.begin('alice', NULL, 'a', fp('{}'));
SELECT idempotency.begin('alice', '', 'a', fp('{}'));
SELECT idempotency.begin('alice', repeat('k', 256), 'a', fp('{}'));
BEGIN;
SELECT (idempotency.begin('alice', repeat('k', 255), 'a', fp('{}'))).outcome;
ROLLBACK;
SELECT idempotency.begin('alice', E'k\n1', 'a', fp('{}'));
SELECT idempotency.begin('alice', 'k', '', fp('{}'));
SELECT idempotency.begin('alice', 'k', 'a', '\x00'::bytea);
SELECT idempotency.begin('alice', 'k', 'a', fp('{}'), ttl => '0');
SELECT idempotency.begin('alice', 'k', 'a', fp('{}'), ttl => '-1 day');
SELECT idempotency.begin('alice', 'k', 'a', fp('{}'), wait => '-1 s');
SET idempotency.max_key_length = 8;
SELECT idempotency.begin('alice', 'nine-long', 'a', fp('{}'));
RESET idempotency.max_key_length;
SET idempotency.max_key_length = 0;
SET idempotency.key_format = 'uuid';
SELECT idempotency.begin('alice', 'not-a-uuid', 'a', fp('{}'));
-- Lower-case digits only (0.9.0; sql/findings_080.sql): one UUID, one key.
SELECT (idempotency.begin('alice', '0190F1E2-3C4D-4E5F-8A6B-7C8D9E0F1A2B', 'a', fp('{}'))).outcome;
BEGIN;
SELECT (idempotency.begin('alice', '0190f1e2-3c4d-4e5f-8a6b-7c8d9e0f1a2b', 'a', fp('{}'))).outcome;
ROLLBACK;
SET idempotency.key_format = 'uuidv7';
SELECT idempotency.begin('alice', '0190f1e2-3c4d-4e5f-8a6b-7c8d9e0f1a2b', 'a', fp('{}'));
BEGIN;
SELECT (idempotency.begin('alice', '0190f1e2-3c4d-7e5f-8a6b-7c8d9e0f1a2b', 'a', fp('{}'))).outcome;
ROLLBACK;
SET idempotency.key_format = 'ulid';
RESET idempotency.key_format;
SELECT idempotency.complete('alice', 'k-1', 99);
SET idempotency.wait_timeout = '2h';
RESET idempotency.wait_timeout;

-- Read-only transactions cannot take keys.
BEGIN READ ONLY;
SELECT idempotency.begin('alice', 'k-ro', 'a', fp('{}'));
ROLLBACK;

-- forget removes one key (operator tool).
SELECT idempotency.forget('alice', 'k-1'), idempotency.forget('alice', 'k-1');
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-1', 'create_order', fp('{"item":"pen"}'), wait => '0');
ROLLBACK;

-- Nothing failed above changed a stored key.
SELECT principal, key, state, response_status, convert_from(response_body, 'UTF8') AS body
  FROM idempotency.keys ORDER BY principal, key;

-- A large body (stored out of line, TOAST) replays byte for byte.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-big', 'create_order', fp('{"big":true}'));
SELECT idempotency.complete('alice', 'k-big', 200, (SELECT string_agg(md5(i::text), '')::bytea FROM generate_series(1, 8000) AS i));
COMMIT;
SELECT outcome, length(response_body),
       md5(response_body) = (SELECT md5(string_agg(md5(i::text), '')::bytea) FROM generate_series(1, 8000) AS i) AS same_bytes
  FROM idempotency.begin('alice', 'k-big', 'create_order', fp('{"big":true}'));

-- complete() writes a new key's row directly (no INSERT statement): every
-- column as the INSERT would set it.
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-direct', 'create_order', fp('{"d":1}'), '2 hours');
SELECT idempotency.complete('alice', 'k-direct', 201, convert_to('direct', 'UTF8'), '{"ETag":"\"x\""}', 'r-1');
SELECT principal, key, action, octet_length(request_sha256) AS fp_bytes, state, response_status, response_headers,
       convert_from(response_body, 'UTF8') AS body, resource_id, one_time_secret, pg_temp.fence_no(fence) AS fence,
       lease_until,
       created_at = now() AS created_now, expires_at - created_at AS ttl
  FROM idempotency.keys WHERE key = 'k-direct';
COMMIT;
-- A trigger someone added on the table is honoured: complete() then uses the
-- INSERT statement, and the trigger sees the row.
CREATE TABLE key_audit (key text, state text);
CREATE FUNCTION audit_key() RETURNS trigger LANGUAGE plpgsql
    AS $$ BEGIN INSERT INTO public.key_audit VALUES (NEW.key, NEW.state); RETURN NEW; END $$;
CREATE TRIGGER audit AFTER INSERT ON idempotency.keys FOR EACH ROW EXECUTE FUNCTION audit_key();
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-trigger', 'create_order', fp('{"t":1}'));
SELECT idempotency.complete('alice', 'k-trigger', 201, convert_to('seen', 'UTF8'));
COMMIT;
SELECT * FROM key_audit;
DROP TRIGGER audit ON idempotency.keys;
DROP FUNCTION audit_key();
DROP TABLE key_audit;
-- A column someone added (with a default) sends complete() back to the INSERT
-- statement, which fills the default; once the column is dropped again,
-- complete() writes the row directly again, leaving the dropped column NULL.
ALTER TABLE idempotency.keys ADD COLUMN note text DEFAULT 'added';
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-added', 'create_order', fp('{"a":1}'));
SELECT idempotency.complete('alice', 'k-added', 201, convert_to('added', 'UTF8'));
COMMIT;
SELECT key, state, response_status, note FROM idempotency.keys WHERE key = 'k-added';
ALTER TABLE idempotency.keys DROP COLUMN note;
BEGIN;
SELECT outcome FROM idempotency.begin('alice', 'k-dropped', 'create_order', fp('{"a":2}'), '3 hours');
SELECT idempotency.complete('alice', 'k-dropped', 202, convert_to('dropped', 'UTF8'), NULL, 'r-2');
COMMIT;
SELECT key, state, response_status, convert_from(response_body, 'UTF8') AS body, resource_id,
       pg_temp.fence_no(fence) AS fence,
       expires_at - created_at AS ttl
  FROM idempotency.keys WHERE key = 'k-dropped';
SELECT outcome, response_status, convert_from(response_body, 'UTF8') AS body
  FROM idempotency.begin('alice', 'k-dropped', 'create_order', fp('{"a":2}'));

-- Each fence shown was above every fence shown before it.
SELECT pg_temp.fences_in_order() AS fences_grow;

-- Leave the database as we found it for the next test file.
DELETE FROM idempotency.keys;
DROP FUNCTION fp(text);
DROP TABLE orders;
