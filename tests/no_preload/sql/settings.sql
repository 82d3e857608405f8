-- Settings: ranges, the reserved prefix, and values set before the library was
-- loaded. Each pg_regress file runs in a new session, where the library is not
-- loaded until the first call (it is not in shared_preload_libraries here).
\set VERBOSITY sqlstate
-- PostgreSQL cannot check these yet and keeps them as placeholders.
SET idempotency.key_ttl = 'banana';
SET idempotency.bogus = 1;
-- The first call loads the library: PostgreSQL warns and falls back to the
-- default; the extension refuses to run with a TTL nobody chose.
SELECT idempotency.is_final(200);
-- Every function refuses, even one that reads no TTL: one rule, no surprises.
SELECT idempotency.jcs('{}');
SELECT idempotency.claim('p', 'settings-1');
SHOW idempotency.key_ttl;
-- A valid value lifts the refusal.
SET idempotency.key_ttl = '1h';
SELECT idempotency.is_final(200);
-- Loaded now: every bad value is refused when it is set, with its SQLSTATE.
SET idempotency.key_ttl = 'banana';
SET idempotency.key_ttl = '367d';
SET idempotency.bogus = 1;
SET idempotency.lease = '99ms';
SET idempotency.final_statuses = 'junk';
SET idempotency.key_format = 'ulid';
SET idempotency.principal_binding = 'maybe';
SET idempotency.distributed = 'off';
CREATE ROLE settings_role;
ALTER ROLE settings_role SET idempotency.final_statuses = 'junk';
ALTER ROLE settings_role SET idempotency.wait_timeout = '2h';
ALTER ROLE settings_role SET idempotency.final_statuses = '2xx';
SELECT setconfig FROM pg_db_role_setting WHERE setrole = 'settings_role'::regrole;
DROP ROLE settings_role;
-- SET LOCAL ends with its transaction.
BEGIN;
SET LOCAL idempotency.max_key_length = 10;
ROLLBACK;
SHOW idempotency.max_key_length;
SELECT name, setting, unit, min_val, max_val, context FROM pg_settings
 WHERE name LIKE 'idempotency.%' ORDER BY name;
-- A role cannot switch principal_binding off before the library is loaded:
-- PostgreSQL re-checks the placeholder as that role when the library loads
-- and drops it; the binding in effect is then not the one the role asked
-- for, so every call refuses (42501), its own principal too, until a
-- superuser sets it (tests/integration/binding_paths.sh: every other path).
SELECT current_user AS admin \gset
CREATE ROLE settings_app LOGIN;
GRANT USAGE ON SCHEMA idempotency TO settings_app;
GRANT EXECUTE ON FUNCTION idempotency.claim(text, text, interval) TO settings_app;
ALTER ROLE settings_app SET idempotency.principal_binding = 'current_user';
\c - settings_app
\set VERBOSITY sqlstate
SET idempotency.principal_binding = off;
SELECT idempotency.claim('someone_else', 'settings-2');
SHOW idempotency.principal_binding;
SELECT idempotency.claim('settings_app', 'settings-2') AS own_principal;
RESET idempotency.principal_binding;
DISCARD ALL;
SELECT idempotency.claim('settings_app', 'settings-2') AS own_principal;
\c - :admin
DELETE FROM idempotency.keys;
DROP OWNED BY settings_app;
DROP ROLE settings_app;
