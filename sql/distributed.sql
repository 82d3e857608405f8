-- The distributed mode (idempotency.distributed): the same protocol through
-- SQL statements on idempotency.keys instead of its heap and primary key. The
-- whole suite runs again with the setting on (scripts/test.sh); this file
-- checks the setting itself, that each mode takes its own path, and what
-- idempotency.distribute() says without Citus.
\set VERBOSITY sqlstate
CREATE FUNCTION dfp(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/orders', convert_to(t, 'UTF8')) $$;
-- Which statements this session has prepared: the distributed mode's lookup
-- is one of them once it ran (its plan is kept for the session).
CREATE FUNCTION lookup_statement_prepared() RETURNS boolean LANGUAGE sql
    AS $$ SELECT count(*) > 0 FROM pg_backend_memory_contexts
           WHERE ident LIKE 'SELECT principal, key, action, request_sha256, state%' $$;

-- (The whole suite runs once more with PGOPTIONS setting it on: each step here sets its own.)
-- The library is loaded first, so that a server without it in
-- shared_preload_libraries checks the values below as one with it does.
SELECT idempotency.is_final(200) AS loaded \gset
SELECT boot_val, vartype, enumvals FROM pg_settings WHERE name = 'idempotency.distributed';
SET idempotency.distributed = auto;
SET idempotency.distributed = 'sometimes';
SET idempotency.distributed = 'off';

-- auto on a plain table: the direct path, no lookup statement.
BEGIN;
SELECT outcome FROM idempotency.begin('dist', 'k-auto', 'create_order', dfp('{"n":1}'));
SELECT idempotency.complete('dist', 'k-auto', 201, '\x7b7d');
COMMIT;
SELECT outcome, response_status FROM idempotency.begin('dist', 'k-auto', 'create_order', dfp('{"n":1}'));
SELECT lookup_statement_prepared() AS by_statement;

-- on: the same answers, by statements.
SET idempotency.distributed = on;
SELECT outcome, response_status, response_body FROM idempotency.begin('dist', 'k-auto', 'create_order', dfp('{"n":1}'));
SELECT lookup_statement_prepared() AS by_statement;
SELECT outcome FROM idempotency.begin('dist', 'k-auto', 'create_order', dfp('{"n":2}'));
BEGIN;
SELECT outcome FROM idempotency.begin('dist', 'k-on', 'create_order', dfp('{"n":3}'));
SELECT idempotency.complete('dist', 'k-on', 201, '\x7b226964223a337d', '{"Location":"/orders/3"}');
COMMIT;
SELECT outcome, response_status, convert_from(response_body, 'UTF8') AS body, response_headers
  FROM idempotency.begin('dist', 'k-on', 'create_order', dfp('{"n":3}'));
-- Rows either path wrote are read by the other.
SET idempotency.distributed = auto;
SELECT outcome, response_status FROM idempotency.begin('dist', 'k-on', 'create_order', dfp('{"n":3}'));

-- Without Citus, distribute() says what it needs and changes nothing.
SELECT idempotency.distribute();
SELECT idempotency.distribute('pg_class');
SELECT count(*) FROM idempotency.keys WHERE principal = 'dist';
SELECT idempotency.forget('dist', k) FROM (VALUES ('k-auto'), ('k-on')) v(k);
