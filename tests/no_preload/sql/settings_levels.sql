-- A value dropped when the library loads stays refused at every level:
-- SET LOCAL, a function's SET clause and a rolled-back SET, RESET and
-- DISCARD ALL do not lift the refusal; only a session-level SET of a valid
-- value does, once the transaction that loaded the library is over. Each \c
-- is a new session, where the library is loaded again by the first call.
\set VERBOSITY sqlstate
-- The invalid session value is hidden by a valid SET LOCAL at load time.
SET idempotency.key_ttl = 'banana';
BEGIN;
SET LOCAL idempotency.key_ttl = '2h';
SELECT idempotency.is_final(200);
COMMIT;
SELECT idempotency.claim('p', 'levels-1');
SHOW idempotency.key_ttl;
-- Neither SET LOCAL nor a rolled-back SET, RESET or DISCARD ALL lifts it.
BEGIN;
SET LOCAL idempotency.key_ttl = '3h';
SELECT idempotency.is_final(200);
ROLLBACK;
BEGIN;
SET idempotency.key_ttl = '4h';
ROLLBACK;
SELECT idempotency.is_final(200);
RESET idempotency.key_ttl;
SELECT idempotency.is_final(200);
DISCARD ALL;
SELECT idempotency.is_final(200);
-- A function's SET clause does not either, inside or after.
CREATE FUNCTION pg_temp.final_with_ttl() RETURNS boolean LANGUAGE sql
  SET idempotency.key_ttl = '5h' AS $$ SELECT idempotency.is_final(200) $$;
SELECT pg_temp.final_with_ttl();
SELECT idempotency.is_final(200);
-- A session-level SET of a valid value does.
SET idempotency.key_ttl = '6h';
SELECT idempotency.is_final(200);
SHOW idempotency.key_ttl;
RESET idempotency.key_ttl;
SELECT idempotency.is_final(200);

\c
\set VERBOSITY sqlstate
-- An invalid value from a function's SET clause, loaded inside the function:
-- refused there and after (until a session-level SET).
CREATE FUNCTION pg_temp.final_with_bad_statuses() RETURNS boolean LANGUAGE sql
  SET idempotency.final_statuses = 'junk' AS $$ SELECT idempotency.is_final(200) $$;
SELECT pg_temp.final_with_bad_statuses();
SELECT idempotency.is_final(200);
SET idempotency.final_statuses = '2xx';
SELECT idempotency.is_final(200);

\c
\set VERBOSITY sqlstate
-- An invalid SET LOCAL over a valid session value: refused inside its
-- transaction; once it is over, the valid session value is the one in effect.
SET idempotency.lease = '10s';
BEGIN;
SET LOCAL idempotency.lease = '1ms';
SELECT idempotency.is_final(200);
ROLLBACK;
SELECT idempotency.is_final(200);
SET idempotency.lease = '20s';
SELECT idempotency.is_final(200);

\c
\set VERBOSITY sqlstate
-- No false alarm: valid values at every level before the library loads.
SET idempotency.key_ttl = '1h';
BEGIN;
SET LOCAL idempotency.key_ttl = '2h';
SET idempotency.lease = '10s';
SET LOCAL idempotency.lease = '20s';
SELECT idempotency.is_final(200);
SHOW idempotency.key_ttl;
COMMIT;
SHOW idempotency.key_ttl;
SHOW idempotency.lease;
SELECT idempotency.is_final(200);
