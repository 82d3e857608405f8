-- The GRANTs that docs/sql-reference.md gives an application role are enough,
-- and the role still cannot reach the table.
BEGIN;
SELECT plan(7);

CREATE ROLE idem_app_test NOLOGIN;
GRANT USAGE ON SCHEMA idempotency TO idem_app_test;
GRANT EXECUTE ON FUNCTION idempotency.begin(text, text, text, bytea, interval, interval),
                          idempotency.complete(text, text, integer, bytea, jsonb, text, boolean, bigint),
                          idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval, boolean)
   TO idem_app_test;
CREATE TABLE public.app_effects (n int);
GRANT INSERT, SELECT ON public.app_effects TO idem_app_test;

SET LOCAL ROLE idem_app_test;
SELECT is((SELECT outcome FROM idempotency.begin('tenant', 'k-app', 'act', idempotency.fingerprint('POST', '/x'))),
          'started', 'the application role can begin');
SELECT lives_ok($$INSERT INTO public.app_effects VALUES (1)$$, 'and write its own effect');
SELECT ok(idempotency.complete('tenant', 'k-app', 201, convert_to('ok', 'UTF8')), 'and complete');
SELECT ok(idempotency.is_final(201), 'is_final needs no grant');
SELECT throws_ok($$SELECT * FROM idempotency.keys$$, '42501', NULL, 'but cannot read the table');
SELECT throws_ok($$DELETE FROM idempotency.keys$$, '42501', NULL, 'nor delete from it');
SELECT throws_ok($$SELECT idempotency.forget('tenant', 'k-app')$$, '42501', NULL, 'nor forget keys without a grant');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
