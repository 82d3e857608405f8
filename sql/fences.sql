-- Fences across moves (0.8.0): a key's fences grow on whichever node its rows
-- are, with no setval by anyone. Two databases stand for two nodes, each with
-- its own idempotency.fences; node A has drawn many more fences than node B.
-- A key's rows move from A to B (copied as a shard move or tests/scale-out's
-- resharding copies them: the row with its fence) and cleanup deletes them on
-- either side; every fence handed out afterwards is above every fence the key
-- had. Then: a row whose fence is ahead of the clock, the largest fence, and
-- the update from 0.7.0 (which drew from the sequence).
\set VERBOSITY sqlstate
CREATE DATABASE idem_fence_a;
CREATE DATABASE idem_fence_b;
CREATE DATABASE idem_fence_upgrade;
\set fp 'idempotency.fingerprint(''POST'', ''/charges'')'

-- Node A: traffic on other keys (its sequence would be far ahead of B's), then
-- the key: a lease taken, lapsed and taken over, completed.
\c idem_fence_a
CREATE EXTENSION idempotency;
SELECT count(*) AS other_keys FROM generate_series(1, 40) AS i,
       LATERAL idempotency.acquire('p', 'other-' || i, 'charge', :fp) AS a WHERE a.outcome = 'started';
SELECT fence AS a1 FROM idempotency.acquire('p', 'moving', 'charge', :fp, lease => '100 ms', ttl => '3 s') \gset
SELECT pg_sleep(0.15);
SELECT fence AS a2 FROM idempotency.acquire('p', 'moving', 'charge', :fp, lease => '100 ms') \gset
SELECT idempotency.complete('p', 'moving', 200, fence => :a2) AS completed, :a2 > :a1 AS takeover_higher;
-- A second key that stays live, and a third whose row cleanup deletes on A
-- before the move: nothing of it moves.
SELECT fence AS live1 FROM idempotency.acquire('p', 'live', 'charge', :fp, lease => '100 ms') \gset
BEGIN;
SELECT fence AS gone1 FROM idempotency.begin('p', 'gone', 'charge', :fp, ttl => '1 s') \gset
SELECT idempotency.complete('p', 'gone', 201);
COMMIT;
SELECT pg_sleep(1.1);
CALL idempotency.cleanup();
SELECT key FROM idempotency.keys WHERE key IN ('moving', 'live', 'gone') ORDER BY key;
-- The move: the rows of the key that moves, as they are (fence included).
SELECT json_agg(k)::text AS moved FROM idempotency.keys AS k WHERE key IN ('moving', 'live') \gset
DELETE FROM idempotency.keys WHERE key IN ('moving', 'live');

-- Node B: a fresh database whose sequence has drawn nothing.
\c idem_fence_b
CREATE EXTENSION idempotency;
INSERT INTO idempotency.keys SELECT * FROM json_populate_recordset(NULL::idempotency.keys, :'moved');
SELECT key, state, fence = :a2 AS moving_fence, fence = :live1 AS live_fence FROM idempotency.keys ORDER BY key;
SELECT pg_sleep(2.0);
-- The live key's lapsed lease is taken over on B: above A's fence.
SELECT outcome, fence > :live1 AS above_a FROM idempotency.acquire('p', 'live', 'charge', :fp);
-- Cleanup between: the moved key expired and B deletes it; the next use of
-- the key on B has no row to look at, and is above A's fences all the same.
CALL idempotency.cleanup();
SELECT count(*) AS moving_rows FROM idempotency.keys WHERE key = 'moving';
SELECT outcome, fence > :a2 AS above_a FROM idempotency.acquire('p', 'moving', 'charge', :fp, lease => '100 ms');
-- The key cleaned up on A before the move, now used on B: begin, save_final and claim.
BEGIN;
SELECT outcome, fence > :gone1 AS above_a FROM idempotency.begin('p', 'gone', 'charge', :fp);
SELECT idempotency.complete('p', 'gone', 201);
COMMIT;
SELECT fence > :gone1 AS stored_above_a FROM idempotency.keys WHERE key = 'gone';
SELECT idempotency.forget('p', 'gone') AS forgotten,
       idempotency.save_final('p', 'gone', 'charge', :fp, 200) AS saved;
SELECT fence > :gone1 AS saved_above_a FROM idempotency.keys WHERE key = 'gone';

-- A row whose fence is ahead of this node's clock (it moved here from a node
-- whose clock runs ahead, or it was restored): the next fence is that fence
-- + 1, whichever call takes the row over; the stored fence is the one handed out.
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, fence,
                              created_at, expires_at)
SELECT 'p', 'ahead-' || k, 'charge', :fp, 'completed', 201, 8000000000000000000 + 10 * i,
       now() - interval '2 h', now() - interval '1 h'
  FROM unnest(ARRAY['acquire', 'begin', 'save_final', 'claim']) WITH ORDINALITY AS t(k, i);
SELECT outcome, fence FROM idempotency.acquire('p', 'ahead-acquire', 'charge', :fp);
BEGIN;
SELECT outcome, fence FROM idempotency.begin('p', 'ahead-begin', 'charge', :fp);
SELECT idempotency.complete('p', 'ahead-begin', 201);
COMMIT;
SELECT idempotency.save_final('p', 'ahead-save_final', 'charge', :fp, 200) AS saved,
       idempotency.claim('p', 'ahead-claim') AS claimed;
SELECT key, state, fence FROM idempotency.keys WHERE key LIKE 'ahead-%' ORDER BY fence;
-- No fence above the largest bigint: 22003, nothing written.
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, fence,
                              created_at, expires_at)
VALUES ('p', 'top', 'charge', :fp, 'completed', 201, 9223372036854775807,
        now() - interval '2 h', now() - interval '1 h');
SELECT outcome FROM idempotency.acquire('p', 'top', 'charge', :fp);
SELECT outcome FROM idempotency.begin('p', 'top', 'charge', :fp);
SELECT idempotency.save_final('p', 'top', 'charge', :fp, 200);
SELECT idempotency.claim('p', 'top');
SELECT state, fence FROM idempotency.keys WHERE key = 'top';

-- The update from 0.7.0: on the 0.7.0 schema this library draws from the
-- sequence as 0.7.0 did (1, 2, 3); after ALTER EXTENSION UPDATE from the
-- clock, above every fence of the sequence, for a new key and a taken-over one.
\c idem_fence_upgrade
SET client_min_messages = warning;
CREATE EXTENSION idempotency VERSION '0.7.0';
RESET client_min_messages;
SELECT outcome, fence FROM idempotency.acquire('p', 'u-1', 'charge', :fp, lease => '100 ms');
BEGIN;
SELECT outcome, fence FROM idempotency.begin('p', 'u-2', 'charge', :fp);
SELECT idempotency.complete('p', 'u-2', 201);
COMMIT;
SELECT idempotency.claim('p', 'u-3') AS claimed;
SELECT key, fence FROM idempotency.keys ORDER BY key;
-- A sequence moved past the clock by hand stops the update (55000).
SELECT last_value AS sequence_at FROM idempotency.fences \gset
SELECT setval('idempotency.fences', 9000000000000000000) AS moved_by_hand;
ALTER EXTENSION idempotency UPDATE;
SELECT setval('idempotency.fences', :sequence_at) AS put_back;
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS before_us \gset
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT pg_sleep(0.15);
SELECT outcome, fence > 3 AS above_sequence, fence >= :before_us AS from_clock,
       fence <= (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS not_ahead
  FROM idempotency.acquire('p', 'u-1', 'charge', :fp);
SELECT outcome, fence > 3 AS above_sequence, fence >= :before_us AS from_clock
  FROM idempotency.acquire('p', 'u-4', 'charge', :fp);
SELECT last_value = :sequence_at AS sequence_untouched FROM idempotency.fences;
SELECT obj_description('idempotency.fences'::regclass, 'pg_class') LIKE '%from 0.8.0 a fence is the clock%'
       AS sequence_comment;

\c contrib_regression
DROP DATABASE idem_fence_a;
DROP DATABASE idem_fence_b;
DROP DATABASE idem_fence_upgrade;
