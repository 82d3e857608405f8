-- Structure of the key store and the protocol functions.
BEGIN;
SELECT plan(89);

-- The table, column by column.
SELECT has_table('idempotency', 'keys', 'table idempotency.keys exists');
SELECT columns_are('idempotency', 'keys', ARRAY[
    'principal', 'key', 'action', 'request_sha256', 'state', 'response_status', 'response_headers',
    'response_body', 'resource_id', 'one_time_secret', 'fence', 'lease_until', 'created_at', 'expires_at'],
    'keys has exactly the columns of the spec');
SELECT col_type_is('idempotency', 'keys', 'principal', 'text', 'principal is text');
SELECT col_type_is('idempotency', 'keys', 'key', 'text', 'key is text');
SELECT col_type_is('idempotency', 'keys', 'action', 'text', 'action is text');
SELECT col_type_is('idempotency', 'keys', 'request_sha256', 'bytea', 'request_sha256 is bytea');
SELECT col_type_is('idempotency', 'keys', 'state', 'text', 'state is text');
SELECT col_type_is('idempotency', 'keys', 'response_status', 'smallint', 'response_status is smallint');
SELECT col_type_is('idempotency', 'keys', 'response_headers', 'jsonb', 'response_headers is jsonb');
SELECT col_type_is('idempotency', 'keys', 'response_body', 'bytea', 'response_body is bytea');
SELECT col_type_is('idempotency', 'keys', 'resource_id', 'text', 'resource_id is text');
SELECT col_type_is('idempotency', 'keys', 'one_time_secret', 'boolean', 'one_time_secret is boolean');
SELECT col_type_is('idempotency', 'keys', 'fence', 'bigint', 'fence is bigint');
SELECT col_type_is('idempotency', 'keys', 'lease_until', 'timestamp with time zone', 'lease_until is timestamptz');
SELECT col_type_is('idempotency', 'keys', 'created_at', 'timestamp with time zone', 'created_at is timestamptz');
SELECT col_type_is('idempotency', 'keys', 'expires_at', 'timestamp with time zone', 'expires_at is timestamptz');

SELECT col_not_null('idempotency', 'keys', c, c || ' is NOT NULL')
  FROM unnest(ARRAY['principal', 'key', 'action', 'request_sha256', 'state', 'one_time_secret', 'fence',
                    'created_at', 'expires_at']) AS c;
SELECT col_is_null('idempotency', 'keys', c, c || ' is nullable')
  FROM unnest(ARRAY['response_status', 'response_headers', 'response_body', 'resource_id', 'lease_until']) AS c;
SELECT col_default_is('idempotency', 'keys', 'one_time_secret', 'false', 'one_time_secret defaults to false');
SELECT col_has_default('idempotency', 'keys', 'created_at', 'created_at has a default');

SELECT has_pk('idempotency', 'keys', 'keys has a primary key');
SELECT col_is_pk('idempotency', 'keys', ARRAY['principal', 'key'], 'the primary key is (principal, key)');
SELECT has_index('idempotency', 'keys', 'keys_expiry_bucket_idx', 'the index cleanup walks');
SET LOCAL TimeZone = 'UTC';
SELECT is(pg_catalog.pg_get_indexdef('idempotency.keys_expiry_bucket_idx'::regclass),
          'CREATE INDEX keys_expiry_bucket_idx ON idempotency.keys USING btree '
          '(date_bin(''00:00:00.01''::interval, expires_at, ''2000-01-01 00:00:00+00''::timestamp with time zone))',
          'it is a B-tree on expires_at cut to 10 ms');
RESET TimeZone;
SELECT hasnt_index('idempotency', 'keys', 'keys_expires_at_idx', 'the index on expires_at itself is gone (0.8.0)');
SELECT is(p.provolatile::text, 'i', 'date_bin(interval, timestamptz, timestamptz) is IMMUTABLE, as an index needs')
  FROM pg_catalog.pg_proc AS p WHERE p.oid = 'pg_catalog.date_bin(interval, timestamptz, timestamptz)'::regprocedure;
SELECT col_has_check('idempotency', 'keys', 'request_sha256', 'request_sha256 has a CHECK');
SELECT col_has_check('idempotency', 'keys', 'state', 'state has a CHECK');

-- The CHECKs reject what they should.
SELECT throws_ok($$INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, expires_at)
                   VALUES ('p', 'k', 'a', '\x00', 'completed', now() + '1 day')$$,
                 '23514', NULL, 'a fingerprint that is not 32 bytes is refused');
SELECT throws_ok($$INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, expires_at)
                   VALUES ('p', 'k', 'a', decode(repeat('00', 32), 'hex'), 'done', now() + '1 day')$$,
                 '23514', NULL, 'an unknown state is refused');
SELECT throws_ok($$INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, expires_at)
                   VALUES ('p', 'k', 'a', decode(repeat('00', 32), 'hex'), 'completed', now() + '1 day')$$,
                 '23514', NULL, 'a completed row without a status is refused');
SELECT lives_ok($$INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, expires_at, lease_until)
                  VALUES ('p', 'k', 'a', decode(repeat('00', 32), 'hex'), 'in_progress', now() + '1 day', now())$$,
                'a well-formed in_progress row is accepted');
SELECT is((SELECT fence FROM idempotency.keys WHERE principal = 'p' AND key = 'k'),
          currval('idempotency.fences'), 'a row''s fence defaults to the next value of idempotency.fences');

-- pg_dump keeps the keys with the database.
SELECT ok(EXISTS (SELECT 1 FROM pg_extension
                   WHERE extname = 'idempotency' AND 'idempotency.keys'::regclass::oid = ANY (extconfig)),
          'keys is registered with pg_extension_config_dump');
SELECT ok(EXISTS (SELECT 1 FROM pg_extension
                   WHERE extname = 'idempotency' AND 'idempotency.fences'::regclass::oid = ANY (extconfig)),
          'the fence sequence is dumped too, so fences never repeat after a restore');
SELECT ok(NOT has_sequence_privilege('public', 'idempotency.fences', 'USAGE,SELECT,UPDATE'),
          'PUBLIC has no privilege on the fence sequence');

-- Privileges: nobody but the owner touches the table directly.
SELECT ok(NOT has_table_privilege('public', 'idempotency.keys', p), 'PUBLIC has no ' || p || ' on keys')
  FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS p;

-- Functions, with their signatures.
SELECT has_function('idempotency', 'jcs', ARRAY['text'], 'jcs(text)');
SELECT has_function('idempotency', 'jcs', ARRAY['jsonb'], 'jcs(jsonb)');
SELECT has_function('idempotency', 'fingerprint', ARRAY['text', 'text', 'bytea', 'text[]'], 'fingerprint(...)');
SELECT has_function('idempotency', 'begin', ARRAY['text', 'text', 'text', 'bytea', 'interval', 'interval'], 'begin(...)');
SELECT has_function('idempotency', 'complete', ARRAY['text', 'text', 'integer', 'bytea', 'jsonb', 'text', 'boolean', 'bigint'], 'complete(..., fence)');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'complete' AND pronamespace = 'idempotency'::regnamespace),
          1, 'one complete(): no overloads for untyped calls to trip over');
SELECT has_function('idempotency', 'save_final', ARRAY['text', 'text', 'text', 'bytea', 'integer', 'bytea', 'jsonb', 'interval', 'boolean'], 'save_final(...)');
SELECT has_function('idempotency', 'is_final', ARRAY['integer'], 'is_final(integer)');
SELECT has_function('idempotency', 'forget', ARRAY['text', 'text'], 'forget(text, text)');
SELECT has_function('idempotency', 'acquire', ARRAY['text', 'text', 'text', 'bytea', 'interval', 'interval', 'interval'], 'acquire(...)');
SELECT has_function('idempotency', 'renew', ARRAY['text', 'text', 'bigint', 'interval'], 'renew(...)');
SELECT has_function('idempotency', 'bound_principal', ARRAY['text'], 'bound_principal(text)');
SELECT has_function('idempotency', 'release', ARRAY['text', 'text', 'bigint'], 'release(...)');
SELECT has_function('idempotency', 'claim', ARRAY['text', 'text', 'interval'], 'claim(...)');
SELECT ok(NOT has_function_privilege('public', 'idempotency.acquire(text,text,text,bytea,interval,interval,interval)', 'EXECUTE'),
          'PUBLIC cannot execute acquire');
SELECT function_returns('idempotency', 'begin', ARRAY['text', 'text', 'text', 'bytea', 'interval', 'interval'],
                        'idempotency.key_outcome', 'begin returns idempotency.key_outcome');

-- Every SQL and PL/pgSQL function of the extension pins its search_path. The C
-- functions run as their caller with no SET clause (PostgreSQL would save and
-- restore every setting around each call); the protocol's C code switches to
-- the owner's rights around its table statements, whose names are all
-- schema-qualified. The one procedure, cleanup, cannot have a SET clause
-- (COMMIT) and qualifies everything instead.
SELECT is(array_agg(p.oid::regprocedure::text ORDER BY 1), NULL,
          'every SQL and PL/pgSQL function sets search_path = pg_catalog, pg_temp')
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
  JOIN pg_language l ON l.oid = p.prolang
 WHERE p.prokind <> 'p' AND l.lanname <> 'c'
   AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false);
SELECT is(array_agg(p.oid::regprocedure::text ORDER BY 1), NULL,
          'no C function is SECURITY DEFINER or has a SET clause')
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
  JOIN pg_language l ON l.oid = p.prolang
 WHERE l.lanname = 'c' AND (p.prosecdef OR p.proconfig IS NOT NULL);
SELECT is(array_agg(p.oid::regprocedure::text ORDER BY 1), ARRAY['idempotency.cleanup(integer,interval,interval,bigint)'],
          'the only procedure is cleanup')
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE p.prokind = 'p';
SELECT isnt_definer('idempotency', 'cleanup', ARRAY['integer', 'interval', 'interval', 'bigint'],
                    'cleanup runs as its caller (it commits between batches)');
SELECT hasnt_function('idempotency', 'cleanup_batch', ARRAY['integer'], 'cleanup_batch(integer) of 0.4.0 is gone');
SELECT has_function('idempotency', 'cleanup_batch', ARRAY['integer', 'timestamp with time zone'], 'cleanup_batch(integer, timestamptz)');
SELECT is_definer('idempotency', 'cleanup_batch', ARRAY['integer', 'timestamp with time zone'],
                  'cleanup_batch(integer, timestamptz) is SECURITY DEFINER');
SELECT has_function('idempotency', 'schedule_cleanup', ARRAY['text'], 'schedule_cleanup(text)');
SELECT has_function('idempotency', 'unschedule_cleanup', ARRAY[]::text[], 'unschedule_cleanup()');
SELECT has_function('idempotency', 'lookup', ARRAY['text', 'text'], 'lookup(text, text)');
SELECT has_view('idempotency', 'status', 'view idempotency.status exists');
SELECT has_view('idempotency', 'stats', 'view idempotency.stats exists');
SELECT has_view('idempotency', 'abandoned', 'view idempotency.abandoned exists');
SELECT has_function('idempotency', 'stats_reset', ARRAY[]::text[], 'stats_reset()');
SELECT ok(NOT has_function_privilege('public', 'idempotency.stats_reset()', 'EXECUTE'), 'PUBLIC cannot reset the counters');
SELECT is(array_agg(p.oid::regprocedure::text ORDER BY 1), NULL, 'every function has a comment')
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE obj_description(p.oid, 'pg_proc') IS NULL;
SELECT isnt_definer('idempotency', 'begin', ARRAY['text', 'text', 'text', 'bytea', 'interval', 'interval'], 'begin runs as its caller');
SELECT volatility_is('idempotency', 'jcs', ARRAY['text'], 'immutable', 'jcs(text) is IMMUTABLE');
SELECT volatility_is('idempotency', 'begin', ARRAY['text', 'text', 'text', 'bytea', 'interval', 'interval'], 'volatile', 'begin is VOLATILE');
SELECT ok(NOT has_function_privilege('public', 'idempotency.begin(text,text,text,bytea,interval,interval)', 'EXECUTE'),
          'PUBLIC cannot execute begin');

SELECT * FROM finish();
ROLLBACK;
