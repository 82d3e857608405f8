-- Run by tests/integration/trusted_edition.sh in a fresh database of each edition,
-- one psql session per entry (entries are separated by a blank line): the outputs
-- (values or SQLSTATEs) must be the same. Argument checks and their order, NULLs,
-- batches, keys begun twice, read-only transactions, distribute() without Citus.

SELECT idempotency.forget(NULL, 'k')

SELECT idempotency.forget('p', NULL)

SELECT idempotency.is_final(NULL)

SELECT idempotency.is_final(99)

SELECT idempotency.is_final(600)

SELECT idempotency.bound_principal(NULL)

SELECT idempotency.bound_principal('')

SELECT * FROM idempotency.lookup(NULL, 'k')

SELECT * FROM idempotency.lookup('', 'k')

SELECT idempotency.claim(NULL, 'k')

SELECT idempotency.claim('p', 'k', NULL)

SELECT idempotency.claim('p', 'k', '0 s')

SELECT idempotency.renew('p', 'k', NULL)

SELECT idempotency.renew('p', 'k', 1, '50 ms')

SELECT idempotency.release('p', NULL, 1)

SELECT idempotency.complete('p', 'k', NULL)

SELECT idempotency.complete('p', 'k', 99)

SELECT idempotency.complete('p', 'k', 200)

SELECT idempotency.complete('p', 'k', 302)

SELECT idempotency.complete('p', 'k', 302, fence => 1)

SELECT idempotency.complete('', 'k', 200)

SELECT idempotency.complete('p', '', 200)

SELECT idempotency.complete('p', 'k', 200, headers => '[1]')

SELECT idempotency.complete('p', 'k', 200, headers => '"x"')

SELECT * FROM idempotency.begin('p', 'k', 'a', '\x00')

SELECT * FROM idempotency.begin('p', 'k', '', sha256('x'))

SELECT * FROM idempotency.begin('p', 'k', 'a', sha256('x'), '-1 s')

SELECT * FROM idempotency.begin('p', 'k', 'a', sha256('x'), wait => '-1 s')

SELECT * FROM idempotency.begin('p', E'k\x01', 'a', sha256('x'))

SELECT * FROM idempotency.begin('p', 'k', NULL, sha256('x'))

SELECT * FROM idempotency.acquire('p', 'k', 'a', sha256('x'), '50 ms')

SELECT * FROM idempotency.acquire('p', 'k', 'a', sha256('x'), '25 h')

SELECT idempotency.save_final('p', 'k', 'a', sha256('x'), 302)

SELECT idempotency.save_final('p', 'k', 'a', sha256('x'), 700)

SELECT idempotency.save_final('p', 'k', 'a', sha256('x'), NULL)

SELECT * FROM idempotency.begin_batch('p', ARRAY['a','a'], 'x', ARRAY[sha256('1'), sha256('2')])

SELECT * FROM idempotency.begin_batch('p', ARRAY['a','b'], 'x', ARRAY[sha256('1')])

SELECT * FROM idempotency.begin_batch('p', ARRAY['a',NULL], 'x', ARRAY[sha256('1'), sha256('2')])

SELECT * FROM idempotency.begin_batch('p', NULL, 'x', ARRAY[sha256('1')])

SELECT * FROM idempotency.begin_batch('p', '{}', 'x', '{}')

SELECT * FROM idempotency.complete_batch('p', ARRAY['a'], ARRAY[200])

SELECT * FROM idempotency.complete_batch('p', ARRAY['a'], ARRAY[NULL]::int[])

SELECT * FROM idempotency.claim_batch('p', ARRAY['a', 'b'])

SELECT * FROM idempotency.claim_batch('p', NULL)

SELECT idempotency.set_expiry_policy('a', 'x')

SELECT idempotency.set_expiry_policy('a', 'refuse', '0 s')

SELECT idempotency.set_expiry_policy('', 'refuse')

SELECT idempotency.fingerprint(NULL, '/')

SELECT idempotency.fingerprint('GET', '/', NULL, ARRAY[NULL]::text[])

SELECT idempotency.fingerprint('GET', '/', '\x7b7d', ARRAY['x'])

SELECT idempotency.jcs(NULL::text)

SELECT idempotency.jcs('{"a":1}'::jsonb)

SELECT idempotency.jcs('1e400'::jsonb)

SELECT * FROM idempotency.cleanup_batch(0)

SELECT * FROM idempotency.cleanup_batch(NULL)

BEGIN;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
SELECT idempotency.complete('p', 'kk', 302);
ROLLBACK

BEGIN;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
SELECT idempotency.complete('p', 'kk', 200);
SELECT idempotency.complete('p', 'kk', 200);
ROLLBACK

BEGIN;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
SELECT idempotency.complete('p', 'kk', 200, headers => '{"a b": "c"}');
ROLLBACK

BEGIN;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
COMMIT

BEGIN;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
ROLLBACK

BEGIN;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
SELECT outcome FROM idempotency.acquire('p', 'kk', 'a', sha256('x'));
ROLLBACK

BEGIN;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
SELECT idempotency.save_final('p', 'kk', 'a', sha256('x'), 400);
ROLLBACK

BEGIN;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
SELECT idempotency.claim('p', 'kk');
ROLLBACK

BEGIN READ ONLY;
SELECT outcome FROM idempotency.begin('p', 'kk', 'a', sha256('x'));
ROLLBACK

BEGIN READ ONLY;
SELECT idempotency.claim('p', 'kk');
ROLLBACK

SELECT idempotency.distribute()

SELECT idempotency.distribute('pg_class')
