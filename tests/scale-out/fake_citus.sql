-- A stand-in for Citus's catalogs, for tests on one node without Citus (which
-- is not in Debian): just what the extension and the routers' tests read. Run
-- as a superuser in a database with the extension; its objects go away with the
-- database (or the transaction it ran in).
--
-- After it, idempotency.keys is "distributed by principal" (pg_dist_partition),
-- this node is group 1 (pg_dist_local_group), and a principal's shard is its
-- row of pg_catalog.fake_citus_shard, shard 1 without one. Shard 1 is placed on
-- this node, shard 2 on another (group 2). So the extension serves every
-- principal here in the distributed mode, and refuses a locking call with
-- 0A000 "the key's shard is not on this node" once a test moves the principal
-- away:
--
--     INSERT INTO pg_catalog.fake_citus_shard VALUES ('alice', 2);
--
-- pg_dist_object is empty (no function delegated) until a test adds the row
-- of idempotency.begin, as idempotency.distribute() would.
--
-- Citus's shard metadata lock (lock_shard_metadata) is a shared advisory lock
-- on the shard id here. A test that creates idempotency.keys_1 (the relation of
-- shard 1 as Citus names it) has the extension read and write that relation
-- directly for a principal of shard 1, as on a Citus worker.
--
-- Used by tests/pgtap/06_citus_placement.sql, 07_citus_local_shard.sql and the
-- client routers' tests.
SET allow_system_table_mods = on;
CREATE TABLE pg_catalog.pg_dist_partition (
    logicalrelid pg_catalog.regclass NOT NULL,
    partmethod "char" NOT NULL,
    partkey text
);
CREATE TABLE pg_catalog.pg_dist_local_group (groupid integer NOT NULL);
CREATE TABLE pg_catalog.pg_dist_placement (shardid bigint NOT NULL, groupid integer NOT NULL);
CREATE TABLE pg_catalog.fake_citus_shard (principal text PRIMARY KEY, shardid bigint NOT NULL);
-- Empty: no function delegated (a test inserts idempotency.begin's row for a distribute()).
CREATE TABLE pg_catalog.pg_dist_object (classid oid NOT NULL, objid oid NOT NULL,
                                        distribution_argument_index integer);
RESET allow_system_table_mods;

-- Citus's partkey is a node tree; here it is the column's name itself.
CREATE FUNCTION pg_catalog.column_to_column_name(pg_catalog.regclass, text) RETURNS text
    LANGUAGE sql IMMUTABLE AS 'SELECT $2';
CREATE FUNCTION pg_catalog.get_shard_id_for_distribution_column(pg_catalog.regclass, text)
    RETURNS bigint LANGUAGE sql STABLE
    AS $$SELECT coalesce((SELECT s.shardid FROM pg_catalog.fake_citus_shard s
                           WHERE s.principal OPERATOR(pg_catalog.=) $2), 1)$$;

-- Citus takes the lock in the mode $1 (ShareLock for a write); a shared lock will do here.
CREATE FUNCTION pg_catalog.lock_shard_metadata(integer, bigint[]) RETURNS void
    LANGUAGE sql VOLATILE
    AS $$SELECT pg_catalog.pg_advisory_xact_lock_shared(s) FROM pg_catalog.unnest($2) s$$;

INSERT INTO pg_catalog.pg_dist_partition VALUES ('idempotency.keys', 'h', 'principal');
INSERT INTO pg_catalog.pg_dist_local_group VALUES (1);
INSERT INTO pg_catalog.pg_dist_placement VALUES (1, 1), (2, 2);
