-- The roles of docs/sql-reference.md ("Privileges") and docs/operations.md:
-- their GRANT blocks are run as written (tests/pgtap/doc_roles.sh extracts
-- them, the role names prefixed idem_doc_), and each role can then do what the
-- docs say and nothing else. Not one transaction: cleanup commits, so it must
-- be CALLed at top level; the roles are dropped at the end (and at the start,
-- should an earlier run have stopped half-way).
SET client_min_messages = warning;
\set roles `tests/pgtap/doc_roles.sh idem_doc_`
:roles

SELECT plan(70);
SELECT ok(:'roles' LIKE '%GRANT%TO idem_doc_app;%' AND :'roles' LIKE '%TO idem_doc_ops;%'
          AND :'roles' LIKE '%TO idem_doc_monitoring;%' AND :'roles' LIKE '%TO idem_doc_support;%',
          'the docs hold a GRANT block for each of app, ops, monitoring and support');

-- What each role may execute beyond PUBLIC, and which privileges it holds on
-- the extension's relations, by name.
CREATE FUNCTION pg_temp.executes(r name) RETURNS name[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(DISTINCT p.proname ORDER BY p.proname), '{}')
      FROM pg_depend AS e JOIN pg_proc AS p ON e.classid = 'pg_proc'::regclass AND p.oid = e.objid
     WHERE e.refclassid = 'pg_extension'::regclass AND e.deptype = 'e'
       AND e.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
       AND has_function_privilege(r, p.oid, 'EXECUTE')
       AND (r = 'public' OR NOT has_function_privilege('public', p.oid, 'EXECUTE'))
$$;
CREATE FUNCTION pg_temp.holds(r name) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(c.relname || ':' || v.priv ORDER BY c.relname || ':' || v.priv), '{}')
      FROM pg_depend AS e JOIN pg_class AS c ON e.classid = 'pg_class'::regclass AND c.oid = e.objid,
           unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS v(priv)
     WHERE e.refclassid = 'pg_extension'::regclass AND e.deptype = 'e'
       AND e.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
       AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
       AND (CASE WHEN c.relkind = 'S' AND v.priv NOT IN ('SELECT', 'UPDATE') THEN false
                 ELSE has_table_privilege(r, c.oid, v.priv) END)
$$;
SELECT is(pg_temp.executes('public'), '{bound_principal,fingerprint,http_answer,http_storage,is_final,jcs}',
          'PUBLIC executes jcs, fingerprint, is_final, bound_principal, http_answer and http_storage only');
SELECT is(pg_temp.executes('idem_doc_app'),
          '{acquire,begin,begin_batch,claim,claim_batch,complete,complete_batch,release,renew,save_final}',
          'app executes both protocols, claim and the batches, nothing else');
SELECT is(pg_temp.executes('idem_doc_ops'), '{cleanup,cleanup_batch,stats_reset}',
          'ops executes cleanup and stats_reset, nothing else');
SELECT is(pg_temp.executes('idem_doc_monitoring'), '{stats_counters}',
          'monitoring executes the counters behind the stats view, nothing else (not lookup)');
SELECT is(pg_temp.executes('idem_doc_support'), '{forget,lookup}', 'support executes lookup and forget, nothing else');
SELECT is(pg_temp.holds('public'), '{}', 'PUBLIC holds no privilege on the extension''s relations');
SELECT is(pg_temp.holds('idem_doc_app'), '{}', 'app holds no privilege on the extension''s relations');
SELECT is(pg_temp.holds('idem_doc_ops'), '{abandoned:SELECT,oldest_keys:SELECT}',
          'ops may only SELECT the abandoned and oldest_keys views');
SELECT is(pg_temp.holds('idem_doc_monitoring'), '{stats:SELECT,status:SELECT}',
          'monitoring may only SELECT the status and stats views');
SELECT is(pg_temp.holds('idem_doc_support'), '{oldest_keys:SELECT}', 'support may only SELECT the oldest_keys view');

-- Rows for the roles to work on: two expired keys and a live one.
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'roles', k, 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200, now() - interval '2 days', e
  FROM (VALUES ('old-1', now() - interval '1 day'), ('old-2', now() - interval '1 day'),
               ('live', now() + interval '1 day')) AS v(k, e);
-- ... and (0.8.0) an expired key of an action whose policy refuses it: the
-- owner sets the policy, which app's calls read and ops's cleanup applies,
-- though neither role may read the policies.
SELECT idempotency.set_expiry_policy('refund_once', 'refuse', '1 day');
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
VALUES ('refusing', 'gone', 'refund_once', decode(repeat('aa', 32), 'hex'), 'completed', 200,
        now() - interval '2 days', now() - interval '1 hour');

-- app: the transactional protocol ...
SET ROLE idem_doc_app;
BEGIN;
SELECT is((SELECT outcome FROM idempotency.begin('tenant', 'k-tx', 'act', idempotency.fingerprint('POST', '/x'))),
          'started', 'app can begin');
SELECT ok(idempotency.complete('tenant', 'k-tx', status => 201, body => convert_to('ok', 'UTF8')), 'app can complete');
COMMIT;
SELECT is((SELECT outcome FROM idempotency.begin('tenant', 'k-tx', 'act', idempotency.fingerprint('POST', '/x'))),
          'replay', 'app gets the replay');
SELECT ok(idempotency.save_final('tenant', 'k-final', 'act', idempotency.fingerprint('POST', '/x'), 422),
          'app can save_final');
-- ... the lease protocol and claim ...
SELECT fence AS lease_fence FROM idempotency.acquire('tenant', 'k-lease', 'act', idempotency.fingerprint('POST', '/l'),
                                                     lease => '1 min') \gset
SELECT ok(idempotency.renew('tenant', 'k-lease', :lease_fence, '1 min'), 'app can renew');
SELECT ok(idempotency.complete('tenant', 'k-lease', fence => :lease_fence, status => 200), 'app can complete a lease');
SELECT fence AS lease_fence FROM idempotency.acquire('tenant', 'k-release', 'act', idempotency.fingerprint('POST', '/l'),
                                                     lease => '1 min') \gset
SELECT ok(idempotency.release('tenant', 'k-release', :lease_fence), 'app can release');
SELECT ok(idempotency.claim('tenant', 'k-claim'), 'app can claim');
BEGIN;
SELECT is((SELECT array_agg(outcome ORDER BY ord)
             FROM idempotency.begin_batch('tenant', ARRAY['k-b2', 'k-b1'], 'act',
                                          ARRAY[idempotency.fingerprint('POST', '/b2'),
                                                idempotency.fingerprint('POST', '/b1')])),
          '{started,started}', 'app can begin a batch');
SELECT is((SELECT array_agg(completed ORDER BY ord)
             FROM idempotency.complete_batch('tenant', ARRAY['k-b2', 'k-b1'], ARRAY[201, 200])),
          '{t,t}', 'app can complete a batch');
COMMIT;
SELECT is((SELECT array_agg(claimed ORDER BY ord)
             FROM idempotency.claim_batch('tenant', ARRAY['k-claim', 'k-cb'])),
          '{f,t}', 'app can claim a batch');
-- (a lease left to lapse, for ops to find in idempotency.abandoned)
SELECT outcome FROM idempotency.acquire('tenant', 'k-abandoned', 'act', idempotency.fingerprint('POST', '/l'),
                                        lease => '100 ms') \gset
SELECT pg_sleep(0.2);
-- ... the expired key that its action's policy refuses (cleanup has not reached it):
SELECT is((SELECT outcome FROM idempotency.begin('refusing', 'gone', 'refund_once', decode(repeat('aa', 32), 'hex'))),
          'expired', 'app gets expired for a key its action''s policy refuses');
SELECT ok(NOT idempotency.save_final('refusing', 'gone', 'refund_once', decode(repeat('aa', 32), 'hex'), 200)
          AND NOT idempotency.claim('refusing', 'gone'), 'app can neither save_final nor claim the refused key');
SELECT ok(idempotency.is_final(201) AND length(idempotency.jcs('{}')) = 2, 'app can use what PUBLIC may');
-- ... and nothing else.
SELECT throws_ok($$SELECT * FROM idempotency.keys$$, '42501', NULL, 'app cannot read the table');
SELECT throws_ok($$UPDATE idempotency.keys SET response_status = 200$$, '42501', NULL, 'app cannot update it');
SELECT throws_ok($$DELETE FROM idempotency.keys$$, '42501', NULL, 'app cannot delete from it');
SELECT throws_ok($$SELECT * FROM idempotency.status$$, '42501', NULL, 'app cannot read the status view');
SELECT throws_ok($$SELECT * FROM idempotency.lookup('tenant', 'k-tx')$$, '42501', NULL, 'app cannot lookup');
SELECT throws_ok($$SELECT idempotency.forget('tenant', 'k-tx')$$, '42501', NULL, 'app cannot forget');
SELECT throws_ok($$SELECT * FROM idempotency.cleanup_batch(10, NULL)$$, '42501', NULL, 'app cannot delete a batch');
SELECT throws_ok($$CALL idempotency.cleanup()$$, '42501', NULL, 'app cannot run cleanup');
SELECT throws_ok($$SELECT idempotency.schedule_cleanup()$$, '42501', NULL, 'app cannot schedule cleanup');
SELECT throws_ok($$SELECT * FROM idempotency.stats$$, '42501', NULL, 'app cannot read the stats view');
SELECT throws_ok($$SELECT * FROM idempotency.abandoned$$, '42501', NULL, 'app cannot read the abandoned view');
RESET ROLE;

-- ops: CALL idempotency.cleanup() at top level deletes the expired keys and
-- leaves the live ones ...
SET ROLE idem_doc_ops;
CALL idempotency.cleanup(batch_size => 1) \gset
RESET ROLE;
SELECT is(:deleted::bigint, 3::bigint, 'ops ran cleanup: it dealt with the three expired keys');
SELECT is((SELECT array_agg(key ORDER BY key) FROM idempotency.keys WHERE principal = 'roles'), '{live}',
          'ops ran cleanup: the expired keys are gone, the live one kept');
SELECT is((SELECT state || ':' || (response_status IS NULL) FROM idempotency.keys WHERE principal = 'refusing'),
          'expired:true', 'ops ran cleanup: the refused key is kept as a tombstone');
SET ROLE idem_doc_ops;
SELECT is((SELECT deleted FROM idempotency.cleanup_batch(10, NULL)), 0, 'ops can run a batch');
SELECT is((SELECT array_agg(key || ':' || released ORDER BY key) FROM idempotency.abandoned WHERE principal = 'tenant'),
          '{k-abandoned:false,k-release:true}', 'ops sees the lapsed lease and the released one');
SELECT ok(idempotency.stats_reset() <= clock_timestamp(), 'ops can reset the counters');
-- ... and nothing else.
SELECT throws_ok($$SELECT * FROM idempotency.keys$$, '42501', NULL, 'ops cannot read the table');
SELECT throws_ok($$DELETE FROM idempotency.keys$$, '42501', NULL, 'ops cannot delete from it directly');
SELECT throws_ok($$SELECT * FROM idempotency.status$$, '42501', NULL, 'ops cannot read the status view');
SELECT throws_ok($$SELECT * FROM idempotency.stats$$, '42501', NULL, 'ops cannot read the stats view');
SELECT throws_ok($$SELECT * FROM idempotency.lookup('tenant', 'k-tx')$$, '42501', NULL, 'ops cannot lookup');
SELECT throws_ok($$SELECT idempotency.forget('tenant', 'k-tx')$$, '42501', NULL, 'ops cannot forget');
SELECT throws_ok($$SELECT idempotency.begin('tenant', 'k-ops', 'a', idempotency.fingerprint('POST', '/x'))$$,
                 '42501', NULL, 'ops cannot begin');
SELECT throws_ok($$SELECT idempotency.schedule_cleanup()$$, '42501', NULL, 'ops cannot schedule cleanup');
RESET ROLE;

-- monitoring: the status and stats views ...
SET ROLE idem_doc_monitoring;
SELECT ok((SELECT keys FROM idempotency.status WHERE action = 'refund' AND live) = 1, 'monitoring reads the status view');
SELECT throws_ok($$SELECT * FROM idempotency.lookup('tenant', 'k-tx')$$, '42501', NULL,
                 'monitoring cannot lookup (a key''s resource id)');
SELECT ok((SELECT count(*) FROM idempotency.stats WHERE database IS NULL AND action = '(other)') = 1,
          'monitoring reads the stats view');
-- ... and nothing else.
SELECT throws_ok($$SELECT * FROM idempotency.keys$$, '42501', NULL, 'monitoring cannot read the table');
SELECT throws_ok($$SELECT idempotency.forget('tenant', 'k-tx')$$, '42501', NULL, 'monitoring cannot forget');
SELECT throws_ok($$SELECT idempotency.begin('tenant', 'k-mon', 'a', idempotency.fingerprint('POST', '/x'))$$,
                 '42501', NULL, 'monitoring cannot begin');
SELECT throws_ok($$SELECT * FROM idempotency.cleanup_batch(10, NULL)$$, '42501', NULL, 'monitoring cannot delete a batch');
SELECT throws_ok($$CALL idempotency.cleanup()$$, '42501', NULL, 'monitoring cannot run cleanup');
SELECT throws_ok($$SELECT idempotency.stats_reset()$$, '42501', NULL, 'monitoring cannot reset the counters');
SELECT throws_ok($$SELECT * FROM idempotency.abandoned$$, '42501', NULL, 'monitoring cannot see keys in the abandoned view');
SELECT throws_ok($$SELECT * FROM idempotency.oldest_keys$$, '42501', NULL, 'monitoring cannot see the oldest keys');
RESET ROLE;

-- support: lookup and forget ...
SET ROLE idem_doc_support;
SELECT is((SELECT state FROM idempotency.lookup('tenant', 'k-final')), 'completed', 'support can lookup');
SELECT ok((SELECT count(*) FROM idempotency.oldest_keys WHERE principal = 'tenant') > 0, 'support sees the oldest keys');
SELECT ok(idempotency.forget('tenant', 'k-final'), 'support can forget');
-- ... and nothing else.
SELECT throws_ok($$SELECT * FROM idempotency.keys$$, '42501', NULL, 'support cannot read the table');
SELECT throws_ok($$SELECT * FROM idempotency.status$$, '42501', NULL, 'support cannot read the status view');
SELECT throws_ok($$SELECT idempotency.begin('tenant', 'k-sup', 'a', idempotency.fingerprint('POST', '/x'))$$,
                 '42501', NULL, 'support cannot begin');
SELECT throws_ok($$SELECT idempotency.save_final('tenant', 'k-sup', 'a', idempotency.fingerprint('POST', '/x'), 422)$$,
                 '42501', NULL, 'support cannot save_final');
SELECT throws_ok($$SELECT * FROM idempotency.cleanup_batch(10, NULL)$$, '42501', NULL, 'support cannot delete a batch');
SELECT throws_ok($$SELECT * FROM idempotency.stats$$, '42501', NULL, 'support cannot read the stats view');
RESET ROLE;

SELECT * FROM finish();
DELETE FROM idempotency.keys WHERE principal IN ('tenant', 'roles', 'refusing');
DELETE FROM idempotency.expiry_policies WHERE action = 'refund_once';
\set drop `tests/pgtap/doc_roles.sh idem_doc_ drop`
:drop
