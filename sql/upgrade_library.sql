-- The library against the schema version (pg_extension.extversion).
-- (a) This library serves the previous release's schema (0.7.0) until ALTER
-- EXTENSION ... UPDATE, and the update keeps what roles were granted.
-- (b) A schema newer than the library knows is refused by every C function,
-- with a hint to reconnect; the refusal follows the catalog at once (the
-- cached version is invalidated), and ends when the version is one it knows.
-- tests/isolation/specs/schema_newer.spec does (b) for a backend that was
-- already running when another session changed the schema.
\set VERBOSITY sqlstate
SET client_min_messages = warning;
DROP ROLE IF EXISTS idem_uplib_monitoring;
CREATE ROLE idem_uplib_monitoring;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '0.7.0';
RESET client_min_messages;
GRANT USAGE ON SCHEMA idempotency TO idem_uplib_monitoring;
GRANT SELECT ON idempotency.status TO idem_uplib_monitoring;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- (a) Both protocols, claim, forget and lookup on the 0.7.0 schema ...
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'uplib-tx', 'a', idempotency.fingerprint('POST', '/x'));
SELECT idempotency.complete('p', 'uplib-tx', 201);
COMMIT;
SELECT fence AS f FROM idempotency.acquire('p', 'uplib-lease', 'a', idempotency.fingerprint('POST', '/l')) \gset
SELECT idempotency.renew('p', 'uplib-lease', :f) AS renewed,
       idempotency.complete('p', 'uplib-lease', status => 200, fence => :f) AS completed;
SELECT idempotency.save_final('p', 'uplib-final', 'a', idempotency.fingerprint('POST', '/x'), 422) AS saved,
       idempotency.claim('p', 'uplib-claim') AS claimed, idempotency.forget('p', 'uplib-claim') AS forgotten;
SELECT state, response_status FROM idempotency.lookup('p', 'uplib-tx');
SELECT action, state, keys FROM idempotency.status ORDER BY 1, 2;
-- An expired key runs again on the 0.7.0 schema (no expiry policies, no
-- tombstones before 0.8.0): begin starts, claim takes it.
UPDATE idempotency.keys SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour'
 WHERE principal = 'p' AND key = 'uplib-final';
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'uplib-final', 'a', idempotency.fingerprint('POST', '/x'));
ROLLBACK;
SELECT idempotency.claim('p', 'uplib-final') AS claimed_expired;
SELECT idempotency.forget('p', 'uplib-final') AS forgotten;
-- The counters as 0.7.0 declared them (without the columns of 0.8.0).
SET client_min_messages = error;
SELECT count(*) >= 0 AS counters_read, coalesce(max(begin_started), 0) >= 0 AS has_begin_started
  FROM idempotency.stats_counters() WHERE database = current_database();
RESET client_min_messages;
-- ... then the update, and the same keys are served by the same session.
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT outcome, response_status FROM idempotency.begin('p', 'uplib-tx', 'a', idempotency.fingerprint('POST', '/x'));
SELECT outcome, response_status FROM idempotency.acquire('p', 'uplib-lease', 'a', idempotency.fingerprint('POST', '/l'));
SELECT fence AS f FROM idempotency.acquire('p', 'uplib-lease-2', 'a', idempotency.fingerprint('POST', '/l')) \gset
SELECT idempotency.release('p', 'uplib-lease-2', :f) AS released;
-- The status view lost its key columns, its grant was carried over, and the
-- keys moved to idempotency.oldest_keys, which the update grants to nobody.
SELECT action, state, keys FROM idempotency.status ORDER BY 1, 2;
SELECT attname FROM pg_attribute WHERE attrelid = 'idempotency.status'::regclass AND attnum > 0 ORDER BY attnum;
SELECT has_table_privilege('idem_uplib_monitoring', 'idempotency.status', 'SELECT') AS monitoring_keeps_status,
       has_table_privilege('idem_uplib_monitoring', 'idempotency.oldest_keys', 'SELECT') AS monitoring_reads_keys,
       has_table_privilege('public', 'idempotency.oldest_keys', 'SELECT') AS public_reads_keys;
SELECT action, state, principal, key FROM idempotency.oldest_keys ORDER BY 1, 2;

-- (b) Every C function of the extension, called with arguments of its types,
-- refused with 0A000 while the schema is newer than the library (a function
-- added later is called too: the list comes from the catalog).
CREATE FUNCTION pg_temp.call_every_c_function() RETURNS TABLE (fn text, code text)
LANGUAGE plpgsql AS $$
DECLARE
    p record;
    args text;
BEGIN
    FOR p IN SELECT f.oid, f.oid::regprocedure::text AS name, f.proargtypes
               FROM pg_proc AS f
               JOIN pg_depend AS d ON d.classid = 'pg_proc'::regclass AND d.objid = f.oid AND d.deptype = 'e'
              WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
                AND f.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')
              ORDER BY 2 LOOP
        SELECT string_agg(CASE t::regtype::text
                              WHEN 'text' THEN '''x'''
                              WHEN 'bytea' THEN 'decode(repeat(''00'', 32), ''hex'')'
                              WHEN 'interval' THEN '''1 hour'''
                              WHEN 'integer' THEN '200'
                              WHEN 'bigint' THEN '1'
                              WHEN 'jsonb' THEN '''{}''::jsonb'
                              WHEN 'boolean' THEN 'false'
                              WHEN 'text[]' THEN '''{}''::text[]'
                              WHEN 'bytea[]' THEN '''{}''::bytea[]'
                              WHEN 'integer[]' THEN '''{}''::integer[]'
                              WHEN 'jsonb[]' THEN '''{}''::jsonb[]'
                          END || '::' || t::regtype::text, ', ' ORDER BY i)
          INTO args
          FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i);
        fn := p.name;
        BEGIN
            EXECUTE format('SELECT %s(%s)', p.oid::regproc, coalesce(args, ''));
            code := 'served';
        EXCEPTION WHEN OTHERS THEN
            code := SQLSTATE;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;
UPDATE pg_extension SET extversion = '0.99.0' WHERE extname = 'idempotency';
SELECT code, count(*) AS functions FROM pg_temp.call_every_c_function() GROUP BY 1;
SELECT fn FROM pg_temp.call_every_c_function() WHERE code <> '0A000';
-- The message, the detail and the hint that an application sees:
\set VERBOSITY default
SELECT outcome FROM idempotency.begin('p', 'uplib-new', 'a', idempotency.fingerprint('POST', '/x'));
\set VERBOSITY sqlstate
-- Back to a version the library knows: served again, in the same session.
UPDATE pg_extension SET extversion = '0.8.0' WHERE extname = 'idempotency';
SELECT outcome, response_status FROM idempotency.begin('p', 'uplib-tx', 'a', idempotency.fingerprint('POST', '/x'));
-- An unknown version that is not newer by number is refused too (fail closed).
UPDATE pg_extension SET extversion = '0.7.9' WHERE extname = 'idempotency';
SELECT idempotency.is_final(200);
UPDATE pg_extension SET extversion = '0.8.0' WHERE extname = 'idempotency';
SELECT idempotency.is_final(200);

SET client_min_messages = warning;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
DROP OWNED BY idem_uplib_monitoring;
DROP ROLE idem_uplib_monitoring;
