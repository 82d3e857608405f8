-- Batches (0.8.0): begin_batch, complete_batch and claim_batch. Each key gets
-- the outcome the single-key function gives it; one row per key in input
-- order; every argument is checked before the first key lock or write.
\set VERBOSITY sqlstate
CREATE FUNCTION fp(t text) RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/v1/batch', convert_to(t, 'UTF8')) $$;

-- Empty arrays: no rows, nothing written.
SELECT * FROM idempotency.begin_batch('batcher', '{}', 'consume', '{}');
SELECT * FROM idempotency.complete_batch('batcher', '{}', '{}');
SELECT * FROM idempotency.claim_batch('batcher', '{}');

-- Keys in every state: a stored response, one of another request, a one-time
-- secret, a live lease, and a new key.
BEGIN;
SELECT outcome FROM idempotency.begin('batcher', 'b-replay', 'consume', fp('r'));
SELECT idempotency.complete('batcher', 'b-replay', 201, convert_to('done r', 'UTF8'),
                            '{"Location": "/r"}', 'res-r');
SELECT outcome FROM idempotency.begin('batcher', 'b-mismatch', 'consume', fp('m'));
SELECT idempotency.complete('batcher', 'b-mismatch', 200, resource_id => 'res-m');
SELECT outcome FROM idempotency.begin('batcher', 'b-secret', 'consume', fp('s'));
SELECT idempotency.complete('batcher', 'b-secret', 201, convert_to('token', 'UTF8'), one_time_secret => true);
COMMIT;
SELECT outcome FROM idempotency.acquire('batcher', 'b-lease', 'consume', fp('l'), lease => '10 min');

-- One batch, every outcome, in input order (not the key order the locks take).
BEGIN;
SELECT ord, key, outcome, response_status, convert_from(response_body, 'UTF8') AS body, response_headers,
       resource_id, fence IS NOT NULL AS has_fence, lease_until IS NOT NULL AS has_lease,
       expires_at - created_at AS ttl
  FROM idempotency.begin_batch('batcher', ARRAY['b-new', 'b-replay', 'b-mismatch', 'b-lease', 'b-secret'],
                               'consume', ARRAY[fp('n'), fp('r'), fp('x'), fp('l'), fp('s')],
                               ttl => '2 hours', wait => '0');
-- The started key is begun in this transaction: begin again is refused until complete ...
SELECT outcome FROM idempotency.begin('batcher', 'b-new', 'consume', fp('n'));
ROLLBACK;

-- ... and each outcome is the one the single call gives.
SELECT b.key, b.outcome AS batch, s.outcome AS single, b.outcome = s.outcome AS same
  FROM idempotency.begin_batch('batcher', ARRAY['b-replay', 'b-mismatch', 'b-lease', 'b-secret'],
                               'consume', ARRAY[fp('r'), fp('x'), fp('l'), fp('s')], wait => '0') AS b,
       LATERAL idempotency.begin('batcher', b.key, 'consume',
                                 CASE b.key WHEN 'b-replay' THEN fp('r') WHEN 'b-mismatch' THEN fp('x')
                                            WHEN 'b-lease' THEN fp('l') ELSE fp('s') END, wait => '0') AS s
 ORDER BY b.ord;

-- begin_batch, the handler's work, complete_batch, commit: then the batch replays.
BEGIN;
SELECT ord, key, outcome FROM idempotency.begin_batch('batcher', ARRAY['b-3', 'b-1', 'b-2'], 'consume',
                                                     ARRAY[fp('3'), fp('1'), fp('2')]);
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['b-3', 'b-1', 'b-2'], ARRAY[201, 200, 422],
                                         ARRAY[convert_to('three', 'UTF8'), NULL, convert_to('bad', 'UTF8')],
                                         ARRAY['{"Location": "/3"}', NULL, '[["Link", "</a>"], ["Link", "</b>"]]']::jsonb[],
                                         ARRAY['res-3', 'res-1', NULL]);
COMMIT;
SELECT key, state, response_status, convert_from(response_body, 'UTF8') AS body, response_headers, resource_id,
       expires_at - created_at AS ttl
  FROM idempotency.keys WHERE principal = 'batcher' AND key IN ('b-1', 'b-2', 'b-3') ORDER BY key;
BEGIN;
SELECT ord, key, outcome, response_status, convert_from(response_body, 'UTF8') AS body, resource_id
  FROM idempotency.begin_batch('batcher', ARRAY['b-2', 'b-3', 'b-1', 'b-4'], 'consume',
                               ARRAY[fp('2'), fp('3'), fp('1'), fp('4')]);
-- (b-4 started: a COMMIT now would be refused with 55000 until it is completed)
ROLLBACK;

-- complete_batch completes keys begun one by one too; a savepoint rolled back
-- forgets the keys begun in it.
BEGIN;
SELECT outcome FROM idempotency.begin('batcher', 'b-5', 'consume', fp('5'));
SAVEPOINT s;
SELECT key, outcome FROM idempotency.begin_batch('batcher', ARRAY['b-6'], 'consume', ARRAY[fp('6')]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['b-5', 'b-6'], ARRAY[200, 200]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['b-5'], ARRAY[200]);
COMMIT;

-- claim_batch: true for the keys this call claimed; a claimed key is taken.
SELECT * FROM idempotency.claim_batch('batcher', ARRAY['job-2', 'job-1'], ttl => '1 hour');
SELECT * FROM idempotency.claim_batch('batcher', ARRAY['job-1', 'job-3', 'job-2']);
SELECT outcome FROM idempotency.begin('batcher', 'job-3', 'consume', fp('j'));
SELECT key, action, response_status FROM idempotency.keys
 WHERE principal = 'batcher' AND key LIKE 'job-%' ORDER BY key;

-- Bad input: the SQLSTATE, and nothing written or begun.
-- keys and the arrays beside them: different lengths, a NULL element, a repeat -> 22023.
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1', 'e-2'], 'consume', ARRAY[fp('1')]);
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1', NULL], 'consume', ARRAY[fp('1'), fp('2')]);
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1', 'e-2'], 'consume', ARRAY[fp('1'), NULL]);
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1', 'e-2', 'e-1'], 'consume',
                                      ARRAY[fp('1'), fp('2'), fp('3')]);
SELECT * FROM idempotency.begin_batch('batcher', '{{e-1},{e-2}}', 'consume', ARRAY[fp('1'), fp('2')]);
-- The element checks of the single call: fingerprint 22023, key 22P02, ttl and wait 22023.
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1', 'e-2'], 'consume', ARRAY[fp('1'), '\x00']);
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1', ''], 'consume', ARRAY[fp('1'), fp('2')]);
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1'], 'consume', ARRAY[fp('1')], ttl => '0');
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1'], 'consume', ARRAY[fp('1')], wait => '-1 s');
SELECT * FROM idempotency.begin_batch('', ARRAY['e-1'], 'consume', ARRAY[fp('1')]);
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-1'], '', ARRAY[fp('1')]);
-- A NULL argument is 22004, as for the single calls.
SELECT * FROM idempotency.begin_batch('batcher', NULL, 'consume', ARRAY[fp('1')]);
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1'], NULL);
SELECT * FROM idempotency.claim_batch(NULL, ARRAY['e-1']);
-- More than 1000 keys -> 54000 (1000 are fine: see below).
SELECT * FROM idempotency.begin_batch('batcher', (SELECT array_agg('e-' || i) FROM generate_series(1, 1001) AS i),
                                      'consume', (SELECT array_agg(fp('1')) FROM generate_series(1, 1001)));
SELECT * FROM idempotency.complete_batch('batcher', (SELECT array_agg('e-' || i) FROM generate_series(1, 1001) AS i),
                                         (SELECT array_agg(200) FROM generate_series(1, 1001)));
SELECT * FROM idempotency.claim_batch('batcher', (SELECT array_agg('e-' || i) FROM generate_series(1, 1001) AS i));
-- complete_batch: the arrays beside keys, statuses and headers like complete's.
BEGIN;
SELECT count(*) AS started FROM idempotency.begin_batch('batcher', ARRAY['e-1', 'e-2'], 'consume',
                                                       ARRAY[fp('1'), fp('2')]) WHERE outcome = 'started';
SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-2'], ARRAY[200]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-2'], ARRAY[200, 200], bodies => ARRAY['\x01'::bytea]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-2'], ARRAY[200, 200], headers => ARRAY['{}'::jsonb]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-2'], ARRAY[200, 200], resource_ids => ARRAY['x']);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-2'], ARRAY[200, NULL]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-2'], ARRAY[200, 99]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-2'], ARRAY[200, 503]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-2'], ARRAY[200, 200],
                                         headers => ARRAY['{}', '{"Bad Name": "x"}']::jsonb[]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-1'], ARRAY[200, 200]);
ROLLBACK TO SAVEPOINT s;
-- A key not begun here (55000), after a key that was: nothing is stored.
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1', 'e-9'], ARRAY[200, 200]);
ROLLBACK TO SAVEPOINT s;
-- begin_batch and claim_batch on a key begun and not completed here: 55000.
SELECT * FROM idempotency.begin_batch('batcher', ARRAY['e-3', 'e-2'], 'consume', ARRAY[fp('3'), fp('2')]);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM idempotency.claim_batch('batcher', ARRAY['e-3', 'e-1']);
ROLLBACK TO SAVEPOINT s;
-- After all that, both keys are still open and complete once; a second time is 55000.
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-2', 'e-1'], ARRAY[200, 201]);
SELECT * FROM idempotency.complete_batch('batcher', ARRAY['e-1'], ARRAY[200]);
ROLLBACK;
-- claim_batch: a repeat and a NULL are 22023, a bad key 22P02, a bad ttl 22023;
-- the good keys before them are not claimed.
SELECT * FROM idempotency.claim_batch('batcher', ARRAY['c-1', 'c-1']);
SELECT * FROM idempotency.claim_batch('batcher', ARRAY['c-1', NULL]);
SELECT * FROM idempotency.claim_batch('batcher', ARRAY['c-1', E'c\n2']);
SELECT * FROM idempotency.claim_batch('batcher', ARRAY['c-1'], ttl => '367 days');
SELECT count(*) AS written FROM idempotency.keys WHERE principal = 'batcher' AND (key LIKE 'e-%' OR key LIKE 'c-%');

-- 1000 keys in one call.
BEGIN;
SELECT count(*) AS started, min(ord) AS first, max(ord) AS last
  FROM idempotency.begin_batch('batcher', (SELECT array_agg('k-' || i) FROM generate_series(1, 1000) AS i),
                               'consume', (SELECT array_agg(fp(i::text)) FROM generate_series(1, 1000) AS i))
 WHERE outcome = 'started';
SELECT count(*) AS completed
  FROM idempotency.complete_batch('batcher', (SELECT array_agg('k-' || i) FROM generate_series(1, 1000) AS i),
                                  (SELECT array_agg(200) FROM generate_series(1, 1000)))
 WHERE completed;
COMMIT;
SELECT outcome, count(*)
  FROM idempotency.begin_batch('batcher', (SELECT array_agg('k-' || i) FROM generate_series(1, 1000) AS i),
                               'consume', (SELECT array_agg(fp(i::text)) FROM generate_series(1, 1000) AS i))
 GROUP BY 1;

DELETE FROM idempotency.keys WHERE principal = 'batcher';
DROP FUNCTION fp(text);
