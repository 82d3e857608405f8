-- Batches (0.8.0) under idempotency.principal_binding = current_user, with the
-- grants of docs/sql-reference.md ("Privileges", run as written by
-- tests/pgtap/doc_roles.sh, the role names prefixed idem_bind_; the
-- application's is idem_bind_app): like every function
-- that takes a principal, begin_batch and claim_batch refuse (42501) a
-- principal other than the calling role and change nothing, and run for its
-- own. complete and complete_batch check the role too: a key begun for another
-- principal earlier in the transaction (by a role that may) is not completed
-- after SET ROLE to one that may not. The roles are dropped at the end (and at
-- the start, should an earlier run have stopped half-way).
SET client_min_messages = warning;
DELETE FROM idempotency.keys WHERE principal IN ('idem_bind_app', 'bind-other');
\set roles `tests/pgtap/doc_roles.sh idem_bind_`
:roles

SELECT plan(11);
SELECT idempotency.is_final(200) AS loaded \gset
SET idempotency.principal_binding = 'current_user';
SET ROLE idem_bind_app;
SELECT throws_ok($$SELECT * FROM idempotency.begin_batch('bind-other', ARRAY['k1', 'k2'], 'act',
                       ARRAY[idempotency.fingerprint('POST', '/1'),
                             idempotency.fingerprint('POST', '/2')])$$,
                 '42501', NULL, 'begin_batch refuses another principal than the calling role');
SELECT throws_ok($$SELECT * FROM idempotency.claim_batch('bind-other', ARRAY['k1', 'k2'])$$,
                 '42501', NULL, 'claim_batch refuses another principal than the calling role');
SELECT throws_ok($$SELECT * FROM idempotency.complete_batch('bind-other', ARRAY['k1'],
                                                             ARRAY[200])$$,
                 '42501', NULL, 'complete_batch refuses another principal than the calling role');
BEGIN;
SELECT array_agg(outcome ORDER BY ord) AS own_begun
  FROM idempotency.begin_batch('idem_bind_app', ARRAY['k1', 'k2'], 'act',
                               ARRAY[idempotency.fingerprint('POST', '/1'),
                                     idempotency.fingerprint('POST', '/2')]) \gset
SELECT array_agg(completed ORDER BY ord) AS own_completed
  FROM idempotency.complete_batch('idem_bind_app', ARRAY['k1', 'k2'], ARRAY[201, 201]) \gset
COMMIT;
SELECT is(:'own_begun'::text, '{started,started}',
          'begin_batch runs for the calling role''s principal');
SELECT is(:'own_completed'::text, '{t,t}', 'complete_batch completes them');
SELECT is((SELECT array_agg(claimed ORDER BY ord)
             FROM idempotency.claim_batch('idem_bind_app', ARRAY['c1'])),
          '{t}', 'claim_batch runs for the calling role''s principal');
RESET ROLE;
RESET idempotency.principal_binding;
SELECT is((SELECT count(*) FROM idempotency.keys WHERE principal = 'bind-other'), 0::bigint,
          'nothing was written for the other principal');
SELECT is((SELECT count(*) FROM idempotency.keys WHERE principal = 'idem_bind_app'), 3::bigint,
          'the own principal''s two begun keys and one claim are stored');
-- The owner (binding off) begins two keys of another principal, then the
-- transaction switches to the bound application role, which may complete
-- neither; the owner completes them after RESET ROLE (had a refused call
-- completed one, this would raise 55000 and the stored statuses differ).
BEGIN;
SELECT count(*) AS other_begun
  FROM idempotency.begin_batch('bind-other', ARRAY['o1', 'o2'], 'act',
                               ARRAY[idempotency.fingerprint('POST', '/1'),
                                     idempotency.fingerprint('POST', '/2')]) \gset
SET LOCAL idempotency.principal_binding = 'current_user';
SET LOCAL ROLE idem_bind_app;
SELECT throws_ok($$SELECT idempotency.complete('bind-other', 'o1', 202)$$,
                 '42501', NULL, 'complete refuses a key of another principal begun before SET ROLE');
SELECT throws_ok($$SELECT * FROM idempotency.complete_batch('bind-other', ARRAY['o1', 'o2'],
                                                             ARRAY[202, 202])$$,
                 '42501', NULL, 'complete_batch refuses keys of another principal begun before SET ROLE');
RESET ROLE;
SET LOCAL idempotency.principal_binding = off;
SELECT count(*) AS owner_completed FROM idempotency.complete_batch('bind-other', ARRAY['o1', 'o2'], ARRAY[201, 201]) \gset
COMMIT;
SELECT is((SELECT array_agg(key || ':' || state || ':' || response_status ORDER BY key)
             FROM idempotency.keys WHERE principal = 'bind-other'),
          '{o1:completed:201,o2:completed:201}', 'the owner completed them; the refused calls stored nothing');

SELECT * FROM finish();
DELETE FROM idempotency.keys WHERE principal IN ('idem_bind_app', 'bind-other');
\set drop `tests/pgtap/doc_roles.sh idem_bind_ drop`
:drop
