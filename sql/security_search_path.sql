-- A hostile search_path (issue 11, item 4). As superuser, every function and
-- procedure of the extension is called under `search_path = trap, pg_catalog`,
-- where schema trap holds a trap named like every built-in the extension uses:
-- functions and aggregates with the same names and argument types, operators
-- with the same signatures, domains named like the types, and relations named
-- like ours. A second run adds pg_temp traps (pg_temp is searched first for
-- relations and types when the path does not list it), and a third reproduces
-- the planted-domain attack of the issue. A trap that fires logs itself and
-- raises a WARNING; the log must stay empty, and every function and procedure
-- of the extension must have been called.
--
-- Errors are shown with their message (VERBOSITY terse), so that a WARNING of
-- a trap says which one fired.
\set VERBOSITY terse
SET client_min_messages = warning;
-- Everything below is created under a path that has only the real built-ins.
SET search_path = pg_catalog;
DELETE FROM idempotency.keys;

-- ---------------------------------------------------------------------------
-- The log. A fire inside a call that then fails is rolled back from the table,
-- but not from the sequence (nor from the WARNING in this output).
CREATE SCHEMA trap_log;
CREATE TABLE trap_log.fired (n serial, what text NOT NULL, ran_as name NOT NULL DEFAULT current_user);
CREATE SEQUENCE trap_log.fires;
CREATE FUNCTION trap_log.fire(what text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.nextval('trap_log.fires');
    INSERT INTO trap_log.fired (what) VALUES (what);
    RAISE WARNING 'trap fired: %', what;
    RETURN true;
END
$$;

-- ---------------------------------------------------------------------------
-- The traps.
CREATE SCHEMA trap;

-- Functions named like the built-ins called in the extension's SQL bodies and
-- in the SQL strings of src/extension/*.cpp (qualified or not), those it may
-- come to call, and the functions behind the operators: a trap for every
-- pg_catalog overload with plain argument and result types. Each trap logs,
-- then returns what the real function returns, so one trap hides no other.
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN
        SELECT p.proname, p.prorettype::regtype AS ret,
               (SELECT string_agg(format('$%s', i), ', ') FROM generate_series(1, p.pronargs) AS i) AS args,
               (SELECT string_agg(t::regtype::text, ', ' ORDER BY o) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, o))
                   AS argtypes
          FROM pg_proc AS p
         WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f' AND NOT p.proretset
           AND p.proname IN ('now', 'clock_timestamp', 'statement_timestamp', 'transaction_timestamp', 'timeofday',
                             'current_setting', 'set_config', 'count', 'max', 'min', 'sum', 'decode', 'encode',
                             'repeat', 'date_part', 'date_trunc', 'date_bin', 'extract', 'pg_sleep', 'pg_sleep_for',
                             'octet_length', 'length', 'upper', 'lower', 'jsonb_typeof', 'jsonb_build_object',
                             'texteq', 'textne', 'byteaeq', 'int8eq', 'int4eq', 'int4lt', 'int8pl', 'int84pl',
                             'timestamptz_le', 'timestamptz_lt', 'timestamptz_gt', 'timestamptz_pl_interval',
                             'interval_pl', 'tideq', 'nextval', 'currval', 'setval', 'sha256', 'convert_to',
                             'convert_from', 'make_interval', 'to_timestamp', 'age', 'timezone', 'array_length',
                             'cardinality', 'format', 'concat', 'hashtext', 'hashtextextended',
                             'pg_advisory_xact_lock', 'pg_try_advisory_xact_lock', 'pg_backend_pid',
                             'pg_current_xact_id', 'txid_current', 'to_regclass', 'int2', 'int4', 'int8', 'text', 'bytea',
                             'timestamptz', 'interval', 'numeric', 'float8', 'bool', 'jsonb',
                             'ceil', 'to_char', 'jsonb_array_length')
           AND NOT EXISTS (SELECT FROM pg_type AS t
                            WHERE t.oid = ANY (p.proargtypes::oid[] || NULLIF(p.prorettype, 'void'::regtype))
                              AND t.typtype = 'p')
    LOOP
        EXECUTE format($f$CREATE FUNCTION trap.%1$I(%2$s) RETURNS %3$s LANGUAGE plpgsql VOLATILE
                          SET search_path = pg_catalog, pg_temp
                          AS %4$L$f$,
                       f.proname, f.argtypes, f.ret,
                       format('BEGIN PERFORM trap_log.fire(%L); %s pg_catalog.%I(%s); END',
                              format('function trap.%s(%s)', f.proname, f.argtypes),
                              CASE WHEN f.ret = 'void'::regtype THEN 'PERFORM' ELSE 'RETURN' END, f.proname, f.args));
    END LOOP;
END
$$;

-- Aggregates named like count, max, min and sum, for every plain argument
-- type: the real transition function, and a final function that logs.
CREATE FUNCTION trap_log.count_final(n bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ BEGIN PERFORM trap_log.fire('aggregate trap.count(*)'); RETURN n; END $$;
CREATE AGGREGATE trap.count(*) (SFUNC = pg_catalog.int8inc, STYPE = bigint, INITCOND = '0',
                                 FINALFUNC = trap_log.count_final);
DO $$
DECLARE
    a record;
BEGIN
    FOR a IN
        SELECT p.proname, p.proargtypes[0]::regtype AS arg, g.aggtransfn::regproc AS sfunc,
               g.aggtranstype::regtype AS stype, g.agginitval, p.prorettype::regtype AS ret, p.oid
          FROM pg_proc AS p JOIN pg_aggregate AS g ON g.aggfnoid = p.oid
         WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname IN ('count', 'max', 'min', 'sum')
           AND p.pronargs = 1 AND g.aggkind = 'n' AND g.aggfinalfn = 0 AND g.aggtranstype = p.prorettype
           AND NOT EXISTS (SELECT FROM pg_type AS t
                            WHERE t.oid IN (p.proargtypes[0], g.aggtranstype) AND t.typtype = 'p')
    LOOP
        EXECUTE format($f$CREATE FUNCTION trap_log.final_%1$s(v %2$s) RETURNS %2$s LANGUAGE plpgsql VOLATILE
                          SET search_path = pg_catalog, pg_temp
                          AS %3$L$f$,
                       a.oid, a.stype,
                       format('BEGIN PERFORM trap_log.fire(%L); RETURN v; END',
                              format('aggregate trap.%s(%s)', a.proname, a.arg)));
        EXECUTE format('CREATE AGGREGATE trap.%I(%s) (SFUNC = %s, STYPE = %s, FINALFUNC = trap_log.final_%s%s)',
                       a.proname, a.arg, a.sfunc, a.stype, a.oid,
                       CASE WHEN a.agginitval IS NOT NULL THEN format(', INITCOND = %L', a.agginitval) ELSE '' END);
    END LOOP;
END
$$;

-- Operators with the signature of every pg_catalog operator over the types
-- the extension's statements compare, add, subtract or concatenate (=, <>, <,
-- <=, >, >=, +, -, ||, LIKE, the jsonb ones, ...).
DO $$
DECLARE
    types oid[] := ARRAY['text', 'bytea', 'timestamptz', 'interval', 'int2', 'int4', 'int8', 'tid', 'bool', 'jsonb',
                         'name', 'numeric', 'float8', 'text[]']::regtype[]::oid[];
    op record;
    n integer := 0;
BEGIN
    FOR op IN
        SELECT o.oprname, o.oprkind, o.oprleft::regtype AS l, o.oprright::regtype AS r, o.oprresult::regtype AS ret
          FROM pg_operator AS o
         WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprkind IN ('b', 'l')
           AND (o.oprkind = 'l' OR o.oprleft = ANY (types)) AND o.oprright = ANY (types)
           AND NOT EXISTS (SELECT FROM pg_type AS t WHERE t.oid = o.oprresult AND t.typtype = 'p')
         ORDER BY o.oid
    LOOP
        n := n + 1;
        IF op.oprkind = 'b' THEN
            EXECUTE format($f$CREATE FUNCTION trap_log.operator_%1$s(%2$s, %3$s) RETURNS %4$s LANGUAGE plpgsql VOLATILE
                              SET search_path = pg_catalog, pg_temp
                              AS %5$L$f$,
                           n, op.l, op.r, op.ret,
                           format('BEGIN PERFORM trap_log.fire(%L); RETURN $1 OPERATOR(pg_catalog.%s) $2; END',
                                  format('operator trap.%s(%s, %s)', op.oprname, op.l, op.r), op.oprname));
            EXECUTE format('CREATE OPERATOR trap.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = trap_log.operator_%s)',
                           op.oprname, op.l, op.r, n);
        ELSE
            EXECUTE format($f$CREATE FUNCTION trap_log.operator_%1$s(%2$s) RETURNS %3$s LANGUAGE plpgsql VOLATILE
                              SET search_path = pg_catalog, pg_temp
                              AS %4$L$f$,
                           n, op.r, op.ret,
                           format('BEGIN PERFORM trap_log.fire(%L); RETURN OPERATOR(pg_catalog.%s) $1; END',
                                  format('operator trap.%s(none, %s)', op.oprname, op.r), op.oprname));
            EXECUTE format('CREATE OPERATOR trap.%s (RIGHTARG = %s, FUNCTION = trap_log.operator_%s)',
                           op.oprname, op.r, n);
        END IF;
    END LOOP;
END
$$;

-- Domains named like the types, and relations named like the extension's
-- relations and types, in a schema: trap now, pg_temp in the second run.
-- A relation trap is a view whose every scan logs (and whose INSERT, UPDATE
-- and DELETE log); a type trap is a domain that logs whenever a value is
-- made of it.
CREATE FUNCTION trap_log.plant(schema text) RETURNS void
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $plant$
DECLARE
    d text[];
    r record;
BEGIN
    FOREACH d SLICE 1 IN ARRAY ARRAY[
        ['timestamptz', 'timestamptz'], ['timestamp', 'timestamp'], ['interval', 'interval'], ['text', 'text'],
        ['varchar', 'varchar'], ['name', 'name'], ['bytea', 'bytea'], ['bool', 'bool'], ['boolean', 'bool'],
        ['int2', 'int2'], ['smallint', 'int2'], ['int4', 'int4'], ['integer', 'int4'], ['int', 'int4'],
        ['int8', 'int8'], ['bigint', 'int8'], ['numeric', 'numeric'], ['float8', 'float8'], ['jsonb', 'jsonb'],
        ['json', 'json'], ['tid', 'tid'], ['regclass', 'regclass'], ['oid', 'oid']]
    LOOP
        EXECUTE format('CREATE DOMAIN %I.%I AS pg_catalog.%I CHECK (trap_log.fire(%L))',
                       schema, d[1], d[2], format('domain %s.%s', schema, d[1]));
    END LOOP;
    -- The extension's own relations and (non-row) types.
    FOR r IN
        SELECT c.relname AS name, c.relkind, c.oid::regclass AS real
          FROM pg_depend AS e JOIN pg_class AS c ON e.classid = 'pg_class'::regclass AND c.oid = e.objid
         WHERE e.refclassid = 'pg_extension'::regclass AND e.deptype = 'e'
           AND e.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
           AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
         ORDER BY 1
    LOOP
        IF r.relkind = 'S' THEN
            EXECUTE format('CREATE VIEW %I.%I AS SELECT trap_log.fire(%L) AS fired',
                           schema, r.name, format('relation %s.%s', schema, r.name));
        ELSE
            EXECUTE format($f$CREATE FUNCTION trap_log.%1$I() RETURNS SETOF %2$s LANGUAGE plpgsql VOLATILE
                              SET search_path = pg_catalog, pg_temp
                              AS %3$L$f$,
                           format('scan_%s_%s', schema, r.name), r.real,
                           format('BEGIN PERFORM trap_log.fire(%L); RETURN QUERY SELECT * FROM %s; END',
                                  format('relation %s.%s', schema, r.name), r.real));
            EXECUTE format('CREATE VIEW %I.%I AS SELECT * FROM trap_log.%I()',
                           schema, r.name, format('scan_%s_%s', schema, r.name));
        END IF;
        EXECUTE format($f$CREATE FUNCTION trap_log.%1$I() RETURNS trigger LANGUAGE plpgsql VOLATILE
                          SET search_path = pg_catalog, pg_temp
                          AS %2$L$f$,
                       format('write_%s_%s', schema, r.name),
                       format('BEGIN PERFORM trap_log.fire(%L || TG_OP); RETURN NULL; END',
                              format('relation %s.%s: ', schema, r.name)));
        EXECUTE format('CREATE TRIGGER write INSTEAD OF INSERT OR UPDATE OR DELETE ON %I.%I
                        FOR EACH ROW EXECUTE FUNCTION trap_log.%I()',
                       schema, r.name, format('write_%s_%s', schema, r.name));
    END LOOP;
    FOR r IN
        SELECT t.typname AS name, t.oid::regtype AS real
          FROM pg_depend AS e JOIN pg_type AS t ON e.classid = 'pg_type'::regclass AND t.oid = e.objid
         WHERE e.refclassid = 'pg_extension'::regclass AND e.deptype = 'e'
           AND e.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
           -- 17+ also record the implicit array types and the relations' row types
           AND t.oid NOT IN (SELECT typarray FROM pg_type UNION SELECT reltype FROM pg_class WHERE relkind <> 'c')
         ORDER BY 1
    LOOP
        EXECUTE format('CREATE DOMAIN %I.%I AS %s CHECK (trap_log.fire(%L))',
                       schema, r.name, r.real, format('domain %s.%s', schema, r.name));
    END LOOP;
END
$plant$;
SELECT trap_log.plant('trap');

-- What was planted (counts for the generated kinds, names for ours). The
-- catalog has other overloads on other versions: counted here as on 15 (17
-- has 3 more functions and 1 aggregate less, 18 has 9 and 1 more).
SELECT current_setting('server_version_num')::int / 10000 AS major \gset
SELECT 'function' AS trap,
       count(*) - CASE :major WHEN 17 THEN 3 WHEN 18 THEN 9 ELSE 0 END AS count
  FROM pg_proc WHERE pronamespace = 'trap'::regnamespace AND prokind = 'f'
UNION ALL
SELECT 'aggregate', count(*) - CASE :major WHEN 17 THEN -1 WHEN 18 THEN 1 ELSE 0 END
  FROM pg_proc WHERE pronamespace = 'trap'::regnamespace AND prokind = 'a'
UNION ALL
SELECT 'operator', count(*) FROM pg_operator WHERE oprnamespace = 'trap'::regnamespace
UNION ALL
SELECT 'domain', count(*) FROM pg_type WHERE typnamespace = 'trap'::regnamespace AND typtype = 'd'
UNION ALL
SELECT 'view', count(*) FROM pg_class WHERE relnamespace = 'trap'::regnamespace AND relkind = 'v';
SELECT c.relname AS relation_trap FROM pg_class AS c WHERE c.relnamespace = 'trap'::regnamespace AND c.relkind = 'v'
 ORDER BY 1;
SELECT oprname, count(*) AS operator_traps FROM pg_operator WHERE oprnamespace = 'trap'::regnamespace
 GROUP BY 1 ORDER BY 1;
-- Every built-in function name that the extension's SQL and PL/pgSQL bodies
-- call (comments and string literals aside, with or without pg_catalog.) has
-- a trap, but those that cannot have one of this kind: the set-returning,
-- polymorphic and aggregate ones that http_answer calls (jsonb_agg,
-- jsonb_array_elements, jsonb_build_array, jsonb_each, to_json), and the
-- column alias lists that look like calls (e, t). Its SET search_path keeps
-- them in pg_catalog as it keeps the trapped ones: the runs below call it.
SELECT DISTINCT c.name AS untrapped_function
  FROM pg_depend AS e JOIN pg_proc AS p ON e.classid = 'pg_proc'::regclass AND p.oid = e.objid
  JOIN pg_language AS l ON l.oid = p.prolang AND l.lanname IN ('sql', 'plpgsql'),
       regexp_replace(regexp_replace(p.prosrc, '--[^\n]*', '', 'g'), '''([^'']|'''')*''', '''''', 'g') AS src,
       regexp_matches(src, '([A-Za-z_][A-Za-z0-9_$]*\.)?([A-Za-z_][A-Za-z0-9_$]*)\s*\(', 'g') AS m,
       lower(m[2]) AS c(name)
 WHERE e.refclassid = 'pg_extension'::regclass AND e.deptype = 'e'
   AND e.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND coalesce(m[1], 'pg_catalog.') = 'pg_catalog.'
   AND c.name NOT IN ('all', 'and', 'any', 'array', 'as', 'check', 'coalesce', 'exists', 'filter', 'from', 'greatest',
                      'in', 'into', 'least', 'materialized', 'not', 'nullif', 'on', 'operator', 'or', 'over', 'returning', 'row',
                      'select', 'some', 'table', 'then', 'using', 'values', 'when', 'where', 'with')
   AND NOT EXISTS (SELECT FROM pg_proc AS t WHERE t.pronamespace = 'trap'::regnamespace AND t.proname = c.name)
 ORDER BY 1;

-- Expired rows for the cleanup calls of each run.
CREATE FUNCTION trap_log.expired_rows(principal text) RETURNS void
    LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
    SELECT principal, 'old-' || i, 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200,
           timestamptz '1999-12-31 00:00+00', timestamptz '2000-01-01 00:00+00' + i * interval '1 minute'
      FROM generate_series(1, 8) AS i
$$;
-- Call counts of the extension's functions, from zero.
CREATE FUNCTION trap_log.count_calls() RETURNS void
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_stat_reset_single_function_counters(e.objid)
       FROM pg_depend AS e
      WHERE e.classid = 'pg_proc'::regclass AND e.refclassid = 'pg_extension'::regclass AND e.deptype = 'e'
        AND e.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency');
END
$$;
SELECT trap_log.count_calls();

-- ---------------------------------------------------------------------------
-- Run 1, in a fresh session (PL/pgSQL resolves a function's declarations once
-- per session): search_path = trap, pg_catalog.
\c -
SET client_min_messages = warning;
SET track_functions = 'all';
SELECT trap_log.expired_rows('expired-1');
\set p run-1
SET search_path = trap, pg_catalog;
\i sql/include/search_path_calls.psql
RESET search_path;
SELECT pg_stat_force_next_flush();

-- ---------------------------------------------------------------------------
-- Run 2, in a fresh session, with traps in pg_temp too: the path does not list
-- pg_temp, so it is searched first for relations and types.
\c -
SET client_min_messages = warning;
SET track_functions = 'all';
SELECT trap_log.expired_rows('expired-2');
SELECT trap_log.plant('pg_temp');
\set p run-2
SET search_path = trap, pg_catalog;
\i sql/include/search_path_calls.psql
RESET search_path;
SELECT pg_stat_force_next_flush();

-- ---------------------------------------------------------------------------
-- Run 3, the attack of the issue: a role with CREATE on a schema plants a
-- domain named timestamptz whose CHECK calls its own function; a superuser
-- with that schema first in search_path runs CALL idempotency.cleanup().
\c -
SET client_min_messages = warning;
CREATE ROLE regress_idem_planter NOLOGIN;
CREATE SCHEMA planted;
GRANT USAGE, CREATE ON SCHEMA planted TO regress_idem_planter;
SET ROLE regress_idem_planter;
CREATE TABLE planted.spied (ran_as name, superuser text);
CREATE FUNCTION planted.spy(v pg_catalog.timestamptz) RETURNS boolean
    LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO planted.spied VALUES (current_user, pg_catalog.current_setting('is_superuser'));
    RAISE WARNING 'planted function ran as %', current_user;
    RETURN true;
END
$$;
CREATE DOMAIN planted.timestamptz AS pg_catalog.timestamptz CHECK (planted.spy(VALUE));
RESET ROLE;
SELECT trap_log.expired_rows('expired-3');
SET search_path = planted, pg_catalog;
CALL idempotency.cleanup();
RESET search_path;
-- What the planted function could do as the superuser (nothing, if it never ran).
SELECT ran_as, superuser, count(*) FROM planted.spied GROUP BY 1, 2;

-- ---------------------------------------------------------------------------
-- The verdict, in a fresh session (the runs' call counts are flushed).
\c -
SET client_min_messages = warning;
-- No trap fired: the log and the count of fires (which a rollback keeps) are empty.
SELECT n, what, ran_as FROM trap_log.fired ORDER BY n;
SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS fires FROM trap_log.fires;
-- Every function and procedure of the extension ran to completion in the runs
-- above, but schedule_cleanup, unschedule_cleanup and distribute: without
-- pg_cron (55000) or Citus (0A000) in this database only their error path can
-- run (called above).
SELECT p.oid::regprocedure AS never_called
  FROM pg_depend AS e JOIN pg_proc AS p ON e.classid = 'pg_proc'::regclass AND p.oid = e.objid
 WHERE e.refclassid = 'pg_extension'::regclass AND e.deptype = 'e'
   AND e.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND NOT EXISTS (SELECT FROM pg_stat_user_functions AS s WHERE s.funcid = p.oid AND s.calls > 0)
 ORDER BY p.oid::regprocedure::text;

DROP SCHEMA trap CASCADE;
DROP SCHEMA trap_log CASCADE;
DROP SCHEMA planted CASCADE;
DROP ROLE regress_idem_planter;
DELETE FROM idempotency.keys;
