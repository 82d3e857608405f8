-- The key on a Citus worker's own shard, on one node without Citus: the
-- catalogs of tests/scale-out/fake_citus.sql (created in this transaction and
-- rolled back), shard 1 on this node. A locking call takes the shard's metadata
-- lock (lock_shard_metadata, here a shared advisory lock on the shard id) to
-- the end of the transaction, once per principal, and again after a savepoint
-- that took it rolls back; the placement is read at every locking call. When the shard's relation idempotency.keys_1 exists
-- with the key table's columns, the lookup and the insert of a new key read and
-- write it directly (no statement on the shell table); with
-- idempotency.distributed = on, citus.enable_local_execution = off, with a
-- shard relation of other columns, or without lock_shard_metadata, they are
-- statements (which Citus would route; here they reach the shell table).
SET client_min_messages = warning;
BEGIN;
\ir ../scale-out/fake_citus.sql
INSERT INTO pg_catalog.fake_citus_shard VALUES ('bob', 3);
INSERT INTO pg_catalog.pg_dist_placement VALUES (3, 1);
CREATE FUNCTION pg_temp.shard_locked(bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pg_catalog.pg_locks
                    WHERE pid = pg_catalog.pg_backend_pid() AND locktype = 'advisory'
                      AND mode = 'ShareLock' AND granted AND objsubid = 1
                      AND classid = 0 AND objid = $1::oid)$$;
CREATE FUNCTION pg_temp.rows(regclass, text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM %s WHERE key = $1', $1) INTO n USING $2;
    RETURN n;
END $$;
-- begin and complete of a new key; how many rows of it the shard relation then holds.
CREATE FUNCTION pg_temp.in_shard_after_request(text, text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT outcome FROM idempotency.begin($1, $2, 'act', idempotency.fingerprint('POST', $2)))
       IS DISTINCT FROM 'started' OR NOT idempotency.complete($1, $2, 201, '\x6f6b'::bytea) THEN
        RAISE EXCEPTION 'the request under % was not served', $2;
    END IF;
    RETURN pg_temp.rows('idempotency.keys_1', $2);
END $$;

SELECT plan(23);

-- The lock, without a shard relation: statements, into the shell table.
SELECT ok(NOT pg_temp.shard_locked(1), 'no shard lock before the first call');
SELECT is((SELECT outcome FROM idempotency.begin('alice', 'k1', 'act',
                                                 idempotency.fingerprint('POST', '/1'))),
          'started', 'begin for a principal of shard 1');
SELECT ok(pg_temp.shard_locked(1), 'it took the metadata lock of shard 1 in share mode');
SELECT ok(idempotency.complete('alice', 'k1', 201, '\x6f6b'::bytea), 'complete');
SELECT is(pg_temp.rows('idempotency.keys', 'k1'), 1::bigint,
          'without a shard relation the row is a statement''s (the shell table here)');

-- A savepoint that took the lock rolls back: the lock goes, the next call takes it again.
SAVEPOINT s;
SELECT is((SELECT outcome FROM idempotency.begin('bob', 'k1', 'act',
                                                 idempotency.fingerprint('POST', '/1'))),
          'started', 'begin for a principal of shard 3 in a savepoint');
SELECT ok(pg_temp.shard_locked(3), 'it took the lock of shard 3');
ROLLBACK TO SAVEPOINT s;
SELECT ok(NOT pg_temp.shard_locked(3), 'the rollback to the savepoint released it');
SELECT is((SELECT outcome FROM idempotency.begin('bob', 'k1', 'act',
                                                 idempotency.fingerprint('POST', '/1'))),
          'started', 'begin again after the rollback');
SELECT ok(pg_temp.shard_locked(3), 'took the lock again (the principal was not left as checked)');
SELECT ok(idempotency.complete('bob', 'k1', 201, '\x6f6b'::bytea), 'and completes');

-- The shard's relation: the lookup and the new key's insert go to it directly.
CREATE TABLE idempotency.keys_1 (LIKE idempotency.keys INCLUDING ALL);
SELECT is((SELECT outcome FROM idempotency.begin('alice', 'k2', 'act',
                                                 idempotency.fingerprint('POST', '/2'))),
          'started', 'begin with the shard relation idempotency.keys_1 in place');
SELECT ok(idempotency.complete('alice', 'k2', 201, '\x6f6b'::bytea), 'complete');
SELECT is(pg_temp.rows('idempotency.keys_1', 'k2'), 1::bigint,
          'the key row went into the shard relation (direct access)');
SELECT is(pg_temp.rows('idempotency.keys', 'k2'), 0::bigint, 'and not into the shell table');
INSERT INTO idempotency.keys_1 (principal, key, action, request_sha256, state, response_status,
                                fence, created_at, expires_at)
    VALUES ('alice', 'k3', 'act', idempotency.fingerprint('POST', '/3'), 'completed', 201, 1,
            now(), now() + interval '1 day');
SELECT is((SELECT outcome FROM idempotency.begin('alice', 'k3', 'act',
                                                 idempotency.fingerprint('POST', '/3'))),
          'replay', 'the lookup reads the shard relation: a row stored there is replayed');

-- Where the extension must not bypass Citus: statements.
SET LOCAL idempotency.distributed = on;
SELECT is(pg_temp.in_shard_after_request('alice', 'k4'), 0::bigint,
          'idempotency.distributed = on: a statement, not the shard relation');
RESET idempotency.distributed;
SET LOCAL citus.enable_local_execution = off;
SELECT is(pg_temp.in_shard_after_request('alice', 'k5'), 0::bigint,
          'citus.enable_local_execution = off: a statement, not the shard relation');
RESET citus.enable_local_execution;

-- A shard relation whose columns are not the key table's in its order: statements.
DROP TABLE idempotency.keys_1;
CREATE TABLE idempotency.keys_1 (extra integer, LIKE idempotency.keys INCLUDING ALL);
SELECT is(pg_temp.in_shard_after_request('alice', 'k6'), 0::bigint,
          'a shard relation of other columns is not written directly');
SELECT is(pg_temp.rows('idempotency.keys', 'k6'), 1::bigint, 'the row is a statement''s');

-- The shard is asked for and the placement read at every locking call, also with
-- a shard lock held (here the stand-in moves the principal, which Citus cannot do
-- while the lock is held).
INSERT INTO pg_catalog.fake_citus_shard VALUES ('alice', 2);
SELECT throws_ok($$SELECT * FROM idempotency.begin('alice', 'k8', 'act',
                                                   idempotency.fingerprint('POST', '/8'))$$,
                 '0A000', 'the key''s shard is not on this node',
                 'a principal moved away after its first call is refused at its next one');
DELETE FROM pg_catalog.fake_citus_shard WHERE principal = 'alice';

-- A Citus without lock_shard_metadata: no lock, so no direct access either.
DROP TABLE idempotency.keys_1;
CREATE TABLE idempotency.keys_1 (LIKE idempotency.keys INCLUDING ALL);
DROP FUNCTION pg_catalog.lock_shard_metadata(integer, bigint[]);
SELECT is(pg_temp.in_shard_after_request('dave', 'k7'), 0::bigint,
          'without the shard lock the shard relation is not used directly');
SELECT is(pg_temp.rows('idempotency.keys', 'k7'), 1::bigint, 'the row is a statement''s');
SELECT * FROM finish();
ROLLBACK;
