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
SET client_min_messages = warning;
BEGIN;
\ir ../scale-out/fake_citus.sql
INSERT INTO pg_catalog.fake_citus_shard VALUES ('citus-away', 2);

SELECT plan(10);
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
