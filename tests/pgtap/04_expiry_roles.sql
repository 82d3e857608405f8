-- Expiry policies and tombstones (0.8.0) under the roles of the GRANT blocks of
-- docs/sql-reference.md ("Privileges"), run as written (tests/pgtap/doc_roles.sh,
-- the role names prefixed idem_exp_): the owner sets a refuse policy (granted
-- to nobody); app gets `expired` for a key of that action before cleanup
-- reached it and from its tombstone; ops' cleanup keeps the tombstone;
-- monitoring sees it as its own group of the status view; support looks it up
-- and forgets it. No role sets or reads a policy. Not one transaction: cleanup
-- commits, so it is CALLed at top level; the roles and keys are dropped at the
-- end (and at the start, should an earlier run have stopped half-way).
SET client_min_messages = warning;
DELETE FROM idempotency.keys WHERE principal = 'exp';
\set roles `tests/pgtap/doc_roles.sh idem_exp_`
:roles

SELECT plan(25);
SELECT ok(:'roles' LIKE '%TO idem_exp_app;%' AND :'roles' LIKE '%TO idem_exp_support;%',
          'the docs'' GRANT blocks ran for the idem_exp_ roles');
SELECT lives_ok($$SELECT idempotency.set_expiry_policy('exp_pay', 'refuse', grace => '1 day')$$,
                'the owner sets a refuse policy');

-- app: two keys of the refusing action, begun and completed.
SET ROLE idem_exp_app;
BEGIN;
SELECT is((SELECT array_agg(outcome ORDER BY ord)
             FROM idempotency.begin_batch('exp', ARRAY['k1', 'k2'], 'exp_pay',
                                          ARRAY[idempotency.fingerprint('POST', '/pay'),
                                                idempotency.fingerprint('POST', '/pay')])),
          '{started,started}', 'app begins two keys of a refusing action');
SELECT is((SELECT array_agg(completed ORDER BY ord)
             FROM idempotency.complete_batch('exp', ARRAY['k1', 'k2'], ARRAY[201, 201])),
          '{t,t}', 'app completes them');
COMMIT;
SELECT throws_ok($$SELECT idempotency.set_expiry_policy('exp_pay', 'run')$$, '42501', NULL,
                 'app cannot set an expiry policy');
SELECT throws_ok($$SELECT * FROM idempotency.expiry_policies$$, '42501', NULL,
                 'app cannot read the policies');
RESET ROLE;

-- The keys' ttl runs out (by hand, as the owner, as the docs' example does).
UPDATE idempotency.keys
   SET created_at = now() - interval '1 hour', expires_at = now() - interval '1 second'
 WHERE principal = 'exp';

-- app, before cleanup reached the keys: the server reads the policy.
SET ROLE idem_exp_app;
-- (each begin in a transaction rolled back; pgTAP's results are checked after it)
BEGIN;
SELECT outcome AS before_cleanup
  FROM idempotency.begin('exp', 'k1', 'exp_pay', idempotency.fingerprint('POST', '/pay')) \gset
ROLLBACK;
SELECT is(:'before_cleanup'::text, 'expired',
          'app: begin of an expired key of a refusing action answers expired before cleanup');
SELECT ok(NOT idempotency.claim('exp', 'k1'), 'app: claim of it is false');
RESET ROLE;

-- ops: cleanup turns the keys into tombstones, does not delete them.
SET ROLE idem_exp_ops;
CALL idempotency.cleanup() \gset
SELECT throws_ok($$SELECT idempotency.set_expiry_policy('exp_pay', 'run')$$, '42501', NULL,
                 'ops cannot set an expiry policy');
SELECT throws_ok($$SELECT * FROM idempotency.expiry_policies$$, '42501', NULL,
                 'ops cannot read the policies');
SELECT throws_ok($$SELECT * FROM idempotency.cleanup_batch_tombstones(10, NULL)$$, '42501', NULL,
                 'ops cannot call cleanup_batch_tombstones directly');
SELECT ok((SELECT count(*) FROM idempotency.oldest_keys
            WHERE action = 'exp_pay' AND state = 'expired' AND live) = 1,
          'ops sees the tombstones'' group in oldest_keys');
SELECT lives_ok($$SELECT * FROM idempotency.cleanup_batch(10, NULL)$$,
                'ops runs a second cleanup batch');
RESET ROLE;
SELECT is((SELECT array_agg(state || ' ' || COALESCE(response_status::text, '-') ORDER BY key)
             FROM idempotency.keys WHERE principal = 'exp'),
          '{"expired -","expired -"}',
          'ops'' cleanup kept both keys as tombstones, and left them alone again');

-- app, from the tombstone: expired (same fingerprint), mismatch (another).
SET ROLE idem_exp_app;
BEGIN;
SELECT outcome AS same_fp
  FROM idempotency.begin('exp', 'k1', 'exp_pay', idempotency.fingerprint('POST', '/pay')) \gset
SELECT outcome AS other_fp
  FROM idempotency.begin('exp', 'k2', 'exp_pay', idempotency.fingerprint('POST', '/x')) \gset
ROLLBACK;
SELECT is(:'same_fp'::text, 'expired', 'app: begin of a tombstone answers expired');
SELECT is(:'other_fp'::text, 'mismatch',
          'app: begin of a tombstone with another fingerprint answers mismatch');
SELECT ok(NOT idempotency.save_final('exp', 'k1', 'exp_pay',
                                     idempotency.fingerprint('POST', '/pay'), 422),
          'app: save_final on a tombstone is false');
RESET ROLE;

-- monitoring: the tombstones are their own group of the status view.
SET ROLE idem_exp_monitoring;
SELECT is((SELECT keys FROM idempotency.status
             WHERE action = 'exp_pay' AND state = 'expired' AND live), 2::bigint,
          'monitoring sees the tombstones as their own group');
SELECT throws_ok($$SELECT * FROM idempotency.expiry_policies$$, '42501', NULL,
                 'monitoring cannot read the policies');
SELECT throws_ok($$SELECT * FROM idempotency.lookup('exp', 'k1')$$, '42501', NULL,
                 'monitoring cannot lookup a tombstone');
RESET ROLE;

-- support: lookup shows a tombstone, forget deletes it.
SET ROLE idem_exp_support;
SELECT is((SELECT state || ' ' || live FROM idempotency.lookup('exp', 'k2')), 'expired true',
          'support: lookup shows the tombstone, live');
SELECT ok(idempotency.forget('exp', 'k2'), 'support: forget deletes a tombstone');
SELECT is((SELECT count(*) FROM idempotency.lookup('exp', 'k2')), 0::bigint,
          'support: the tombstone is gone');
SELECT throws_ok($$SELECT idempotency.set_expiry_policy('exp_pay', 'run')$$, '42501', NULL,
                 'support cannot set an expiry policy');
RESET ROLE;

-- app: the forgotten key starts again.
SET ROLE idem_exp_app;
BEGIN;
SELECT outcome AS again
  FROM idempotency.begin('exp', 'k2', 'exp_pay', idempotency.fingerprint('POST', '/pay')) \gset
ROLLBACK;
SELECT is(:'again'::text, 'started', 'app: a forgotten tombstone''s key starts again');
RESET ROLE;

SELECT * FROM finish();
SELECT idempotency.set_expiry_policy('exp_pay', 'run');
DELETE FROM idempotency.keys WHERE principal = 'exp';
\set drop `tests/pgtap/doc_roles.sh idem_exp_ drop`
:drop
