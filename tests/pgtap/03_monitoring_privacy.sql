-- The monitoring role reads no principal, key, body, header or resource id.
-- The docs' GRANT blocks are run as written (tests/pgtap/doc_roles.sh), the
-- application writes distinctive values through both protocols (a completed
-- key with a body, headers and a resource id, a final error, a lease left to
-- lapse, a claim), and then, as the documented monitoring role, every column
-- of every relation it may read and every function of the extension's schema
-- it may execute - found in the catalogs with has_*_privilege, so an object
-- added later is covered - is searched for those values. The same scan as
-- superuser finds them, so the scan itself can fail.
SET client_min_messages = warning;
DELETE FROM idempotency.keys WHERE principal = 'pv-principal-91c7@example.com';
\set roles `tests/pgtap/doc_roles.sh idem_doc_`
:roles

SELECT plan(7);

-- The application's values, each found nowhere else; a body is also searched
-- for as the hex that bytea columns print.
CREATE TABLE pg_temp.needles (what text, needle text);
INSERT INTO pg_temp.needles VALUES
    ('principal', 'pv-principal-91c7@example.com'), ('key', 'pv-key-4e1d7a'),
    ('body', 'pv-body-0b5f2c'), ('header', 'pv-header-d83e61'), ('resource id', 'pv-resource-a27c44'),
    ('final body', 'pv-final-body-63ae10'), ('lease key', 'pv-lease-key-5d2b9e');
INSERT INTO pg_temp.needles
SELECT what, encode(convert_to(needle, 'UTF8'), 'hex') FROM pg_temp.needles WHERE what LIKE '%body';
GRANT SELECT ON pg_temp.needles TO idem_doc_monitoring;

SET ROLE idem_doc_app;
BEGIN;
SELECT outcome FROM idempotency.begin('pv-principal-91c7@example.com', 'pv-key-4e1d7a', 'pv_action',
                                      idempotency.fingerprint('POST', '/pv'));
SELECT idempotency.complete('pv-principal-91c7@example.com', 'pv-key-4e1d7a', 201,
                            body => convert_to('pv-body-0b5f2c', 'UTF8'),
                            headers => '{"X-Trace": "pv-header-d83e61"}', resource_id => 'pv-resource-a27c44');
COMMIT;
SELECT idempotency.save_final('pv-principal-91c7@example.com', 'pv-key-final', 'pv_action',
                              idempotency.fingerprint('POST', '/pv'), 422,
                              body => convert_to('pv-final-body-63ae10', 'UTF8'),
                              headers => '[["X-Trace", "pv-header-d83e61"]]');
SELECT outcome FROM idempotency.acquire('pv-principal-91c7@example.com', 'pv-lease-key-5d2b9e', 'pv_action',
                                        idempotency.fingerprint('POST', '/pv'), lease => '100 ms');
SELECT idempotency.claim('pv-principal-91c7@example.com', 'pv-key-claim');
RESET ROLE;
SELECT pg_sleep(0.2);        -- the lease lapses: the key shows in idempotency.abandoned
ANALYZE idempotency.keys;    -- pg_stats then holds the table's most common values

-- Every relation `who` may read a column of (outside the system schemas, plus
-- pg_stats, where ANALYZE puts column values), every readable column of it,
-- and every function of the extension's schema `who` may execute that needs
-- no argument, called (unless not `call_functions`): where one of the needles
-- shows.
CREATE FUNCTION pg_temp.leaks(who name, call_functions boolean DEFAULT true) RETURNS TABLE (object text, hit text) LANGUAGE plpgsql AS $$
DECLARE
    rel record;
    fn record;
    columns text;
    needles text[] := ARRAY(SELECT needle FROM pg_temp.needles);
BEGIN
    FOR rel IN SELECT c.oid FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
                  AND (n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
                       AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast_temp%'
                       OR c.oid = 'pg_catalog.pg_stats'::regclass)
                  AND has_any_column_privilege(who, c.oid, 'SELECT') LOOP
        SELECT string_agg(quote_ident(a.attname), ', ') INTO columns FROM pg_attribute AS a
         WHERE a.attrelid = rel.oid AND a.attnum > 0 AND NOT a.attisdropped
           AND has_column_privilege(who, rel.oid, a.attnum, 'SELECT');
        object := rel.oid::regclass::text;
        FOR hit IN EXECUTE format('SELECT DISTINCT n FROM (SELECT %s FROM %s) AS t, unnest($1) AS n'
                                    ' WHERE strpos(t::text, n) > 0', columns, rel.oid::regclass)
                     USING needles LOOP
            RETURN NEXT;
        END LOOP;
    END LOOP;
    IF NOT call_functions THEN
        RETURN;
    END IF;
    FOR fn IN SELECT p.oid FROM pg_proc AS p
               WHERE p.pronamespace = 'idempotency'::regnamespace AND p.prokind = 'f'
                 AND p.pronargs = p.pronargdefaults
                 AND p.prorettype <> 'trigger'::regtype
                 AND has_function_privilege(who, p.oid, 'EXECUTE') LOOP
        object := fn.oid::regprocedure::text;
        FOR hit IN EXECUTE format('SELECT DISTINCT n FROM %s() AS t, unnest($1) AS n'
                                    ' WHERE strpos(t::text, n) > 0', fn.oid::regproc)
                     USING needles LOOP
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;
-- Functions and procedures of the extension's schema that `who` may run with
-- arguments of its choosing (a principal and a key to probe, say), other than
-- the six that touch no table.
CREATE FUNCTION pg_temp.probes(who name) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(p.oid::regprocedure::text ORDER BY 1), '{}') FROM pg_proc AS p
     WHERE p.pronamespace = 'idempotency'::regnamespace
       AND (p.pronargs > p.pronargdefaults OR p.prokind = 'p')
       AND has_function_privilege(who, p.oid, 'EXECUTE')
       AND p.proname NOT IN ('jcs', 'fingerprint', 'is_final', 'bound_principal', 'http_answer',
                             'http_storage')
$$;

SELECT ok((SELECT count(*) FROM pg_temp.leaks(current_user, false) WHERE object IN ('idempotency.keys', 'pg_stats')) > 0
          AND (SELECT count(DISTINCT n.what) FROM pg_temp.leaks(current_user, false) AS l
                 JOIN pg_temp.needles AS n ON n.needle = l.hit)
              = (SELECT count(DISTINCT what) FROM pg_temp.needles),
          'as superuser the scan finds every value the app wrote (so it can fail)');

SELECT current_setting('shared_preload_libraries') ~ 'idempotency' AS preloaded \gset
SET ROLE idem_doc_monitoring;
SELECT ok(has_table_privilege('idempotency.status', 'SELECT') AND has_table_privilege('idempotency.stats', 'SELECT'),
          'monitoring reads the status and stats views, as documented');
SELECT ok((SELECT sum(keys) FROM idempotency.status WHERE action = 'pv_action') = 3,
          'the status view counts the app''s keys');
SELECT ok(NOT :'preloaded' OR EXISTS (SELECT FROM idempotency.stats WHERE action = 'pv_action'),
          'the stats view counts the app''s calls (when the library is preloaded)');
SELECT is_empty($$SELECT object || ': ' || hit FROM pg_temp.leaks(current_user) WHERE object NOT LIKE '%(%'$$,
                'no column of any relation monitoring can read holds a principal, key, body, header or resource id');
SELECT is_empty($$SELECT object || ': ' || hit FROM pg_temp.leaks(current_user) WHERE object LIKE '%(%'$$,
                'no function monitoring can execute returns one');
SELECT is(pg_temp.probes(current_user), '{}',
          'monitoring executes no function that takes a principal or key (lookup), nor any procedure');
RESET ROLE;

SELECT * FROM finish();
DELETE FROM idempotency.keys WHERE principal = 'pv-principal-91c7@example.com';
\set drop `tests/pgtap/doc_roles.sh idem_doc_ drop`
:drop
