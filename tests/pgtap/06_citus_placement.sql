-- The extension under Citus's placement, on one node without Citus: the
-- catalogs of tests/scale-out/fake_citus.sql (created in this transaction and
-- rolled back) say idempotency.keys is distributed by principal, with shard 1
-- on this node and shard 2 elsewhere. Every call that locks a key refuses
-- (0A000, "the key's shard is not on this node", the answer the client routers
-- take as a stale placement) for a principal whose shard is elsewhere and
-- writes nothing; a principal whose shard is here is served. A table
-- distributed by another column is refused outright. Runs before any call of
-- this session has read the key table's placement. (forget and lookup take no
-- key lock: under Citus their statements reach the shard wherever it is.)
-- The refusal's detail tells a call routed or delegated here whose shard moved
-- since (a retry goes to the new owner) from one whose form kept Citus from
-- delegating it and from a setup without delegation; idempotency.routed keeps
-- a prepared call's generic plan, which runs here. (A shard that moved while
-- the call waited for its lock needs Citus: tests/scale-out/citus_direct.sh.)
SET client_min_messages = warning;
BEGIN;
\ir ../scale-out/fake_citus.sql
INSERT INTO pg_catalog.fake_citus_shard VALUES ('citus-away', 2);

-- The detail and the hint of the refusal of `call`, and its SQLSTATE.
CREATE FUNCTION pg_temp.refusal(call text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE state text; detail text; hint text;
BEGIN
    EXECUTE call;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, detail = PG_EXCEPTION_DETAIL,
                            hint = PG_EXCEPTION_HINT;
    RETURN state || ' | ' || detail || ' | ' || hint;
END
$f$;

SELECT plan(20);
SELECT is((SELECT outcome FROM idempotency.begin('citus-here', 'k1', 'act',
                                                 idempotency.fingerprint('POST', '/1'))),
          'started', 'a principal whose shard is on this node begins a key');
SELECT ok(idempotency.complete('citus-here', 'k1', 201, '\x6f6b'::bytea), 'and completes it');
SELECT throws_ok($$SELECT * FROM idempotency.begin('citus-away', 'k1', 'act',
                                                   idempotency.fingerprint('POST', '/1'))$$,
                 '0A000', 'the key''s shard is not on this node',
                 'begin refuses a principal whose shard is on another node');
SELECT throws_ok($$SELECT * FROM idempotency.acquire('citus-away', 'k2', 'act',
                                                     idempotency.fingerprint('POST', '/2'),
                                                     '1 minute')$$,
                 '0A000', 'the key''s shard is not on this node', 'so does acquire');
SELECT throws_ok($$SELECT * FROM idempotency.save_final('citus-away', 'k3', 'act',
                                                        idempotency.fingerprint('POST', '/3'),
                                                        201, '\x6f6b'::bytea)$$,
                 '0A000', 'the key''s shard is not on this node', 'so does save_final');
SELECT throws_ok($$SELECT * FROM idempotency.begin_batch('citus-away', ARRAY['k4'], 'act',
                                                         ARRAY[idempotency.fingerprint('POST', '/4')])$$,
                 '0A000', 'the key''s shard is not on this node', 'so does begin_batch');
SELECT throws_ok($$SELECT * FROM idempotency.claim('citus-away', 'k5', '1 minute')$$,
                 '0A000', 'the key''s shard is not on this node', 'so does claim');
SELECT is((SELECT count(*) FROM idempotency.keys WHERE principal = 'citus-away'), 0::bigint,
          'nothing was written for the principal whose shard is elsewhere');

SELECT matches(pg_temp.refusal($$SELECT * FROM idempotency.begin('citus-away', 'k1', 'act',
                                                             idempotency.fingerprint('POST', '/1'))$$),
               '^0A000 \| .*the protocol functions are not delegated to it\. \| Delegate them: run idempotency\.distribute\(\)',
               'functions never delegated: the detail says so, the hint is the setup');
INSERT INTO pg_catalog.pg_dist_object
    SELECT 'pg_catalog.pg_proc'::regclass, p.oid, 0 FROM pg_proc p
     WHERE p.pronamespace = 'idempotency'::regnamespace AND p.proname = 'begin';
SELECT matches(pg_temp.refusal($$SELECT * FROM idempotency.acquire('citus-away', 'k2', 'act',
                                                               idempotency.fingerprint('POST', '/2'),
                                                               '1 minute')$$),
               '^0A000 \| The protocol functions are delegated, but Citus ran this call on the node it was sent to: .* \| Send the call in that form',
               'delegated (distribute() ran) yet run where it was sent: the detail names the call''s form');
DELETE FROM pg_catalog.pg_dist_object;
SET LOCAL idempotency.routed = on;
SELECT matches(pg_temp.refusal($$SELECT * FROM idempotency.begin('citus-away', 'k1', 'act',
                                                             idempotency.fingerprint('POST', '/1'))$$),
               '^0A000 \| The principal''s shard moved to another node .*after this call was routed here.* \| Retry the request: a retry goes to the node that holds the shard now',
               'a call routed here (idempotency.routed): the shard moved, a retry goes to the new owner');
PREPARE routed_begin(text, text) AS
    SELECT outcome FROM idempotency.begin($1, $2, 'act', idempotency.fingerprint('POST', '/p'));
SELECT is((SELECT count(*) FROM generate_series(1, 8) i,
                  LATERAL (SELECT pg_temp.refusal(format('EXECUTE routed_begin(%L, %L)',
                                                         'citus-here', 'p' || i))) r(answer)
            WHERE answer = 'no error'), 8::bigint,
          'routed: a prepared begin runs eight times on the shard''s node');
SELECT cmp_ok((SELECT generic_plans FROM pg_prepared_statements WHERE name = 'routed_begin'),
              '>', 0::bigint, 'and keeps its generic plan');
SELECT throws_ok($$EXECUTE routed_begin('citus-away', 'p9')$$,
                 '0A000', 'the key''s shard is not on this node',
                 'the generic plan runs the call here: a principal whose shard is elsewhere is refused');
DEALLOCATE routed_begin;
SET LOCAL idempotency.routed = off;
SET LOCAL application_name = 'citus_internal gpid=10000000042';
SELECT matches(pg_temp.refusal($$SELECT * FROM idempotency.claim('citus-away', 'k5', '1 minute')$$),
               '^0A000 \| The principal''s shard moved to another node .*after this call was delegated here',
               'a call Citus delegated here: the shard moved since');
RESET application_name;

-- complete and complete_batch take no key lock: one that Citus did not delegate
-- runs where it was sent, which never saw the begin. On a node without the
-- principal's shard the error says so; on the shard's node it does not.
SELECT matches(pg_temp.refusal($$SELECT idempotency.complete('citus-away', 'k6', 201)$$),
               '^55000 \| This node does not hold the principal''s shard: the call ran on the node it was sent to, not where begin ran\. .* \| Send complete in that form',
               'complete for a principal whose shard is elsewhere: not delegated, says the detail');
SELECT matches(pg_temp.refusal($$SELECT count(*) FROM idempotency.complete_batch('citus-away', ARRAY['k6'], ARRAY[201])$$),
               '^55000 \| This node does not hold the principal''s shard',
               'so does complete_batch');
SELECT is(pg_temp.refusal($$SELECT idempotency.complete('citus-here', 'k6', 201)$$),
          '55000 |  | Call idempotency.begin() in the same transaction and complete only when it returns started; pass fence => for a key taken with idempotency.acquire().',
          'on the shard''s node a key never begun gets the plain error, no placement detail');

-- The shard moves here: served at once (the placement is read at every locking call).
UPDATE pg_catalog.fake_citus_shard SET shardid = 1 WHERE principal = 'citus-away';
SELECT is((SELECT outcome FROM idempotency.begin('citus-away', 'k1', 'act',
                                                 idempotency.fingerprint('POST', '/1'))),
          'started', 'after its shard moved here the principal is served');

-- Distributed by the key instead: the relation cache entry of idempotency.keys is
-- invalidated (as Citus does when it distributes a table) and the placement read again.
UPDATE pg_catalog.pg_dist_partition SET partkey = 'key';
ALTER TABLE idempotency.keys SET (autovacuum_enabled = on);
SELECT throws_ok($$SELECT * FROM idempotency.begin('citus-here', 'k9', 'act',
                                                   idempotency.fingerprint('POST', '/9'))$$,
                 '0A000', 'idempotency.keys is distributed by Citus, but not by principal',
                 'a key table distributed by another column is refused');
SELECT * FROM finish();
ROLLBACK;
