-- pg_idempotency 0.7.0 -> 0.8.0: expiry that says so (tombstones and the
-- expired outcome), batches, and fences that never repeat across shard moves.
-- Each feature adds its own section below.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.8.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Fences across moves (issue 24): from 0.8.0 the library draws a fence from the
-- clock of the node that runs the call, in microseconds since 1970, or the
-- key's row's fence + 1 when that is higher (docs/scale-out.md, "Fences across
-- moves"), so that a key's fences keep growing when its rows move to another
-- node, with no setval by anyone. The sequence stays (the column's default and
-- 0.7.0 libraries use it); the library no longer draws from it on this schema.
-- Every fence it handed out is below the clock, hence below every new fence:
-- checked here, so that a sequence someone moved past the clock by hand stops
-- the update rather than let a key's fence go down.
DO $fences$
BEGIN
    IF (SELECT s.last_value FROM idempotency.fences AS s) OPERATOR(pg_catalog.>=)
       (EXTRACT(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000) THEN
        RAISE EXCEPTION 'idempotency.fences is at or past the clock in microseconds'
            USING ERRCODE = '55000',
                  DETAIL = 'From 0.8.0 fences come from the clock; the existing fences must be '
                           'below it.',
                  HINT = 'Undo the setval that moved the sequence, or wait until the clock '
                         'passes it.';
    END IF;
END
$fences$;
COMMENT ON SEQUENCE idempotency.fences IS
    'Fences of the 0.6.0 and 0.7.0 schemas; from 0.8.0 a fence is the clock in microseconds '
    'since 1970 or the row''s fence + 1 (never repeated for a key, across shard moves too); '
    'kept for compatibility';
COMMENT ON COLUMN idempotency.keys.fence IS
    'lease generation: the clock in microseconds since 1970 or the previous row''s fence + 1, '
    'whichever is higher; higher at every takeover, never repeated for a key, on any node';

-- ---------------------------------------------------------------------------
-- Batches: many keys in one call (issue 25 part 2)

-- begin, complete and claim for an array of keys of one principal, one row per
-- key in input order. Each key gets the single function's outcome; the key
-- locks are taken in sorted key order, so two batches never deadlock over the
-- keys they share; every argument is checked before the first lock or write.
-- Like their siblings these are C functions that run as their caller, with no
-- SET clause (see "The C functions run as their caller" in 0.5.0--0.6.0), and
-- only roles granted EXECUTE may call them.
CREATE TYPE idempotency.batch_outcome AS (
    ord              integer,      -- 1-based position of the key in the input array
    key              text,         -- the key
    outcome          text,         -- as idempotency.key_outcome, below
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    resource_id      text,
    created_at       timestamptz,
    expires_at       timestamptz,
    fence            bigint,
    lease_until      timestamptz
);
COMMENT ON TYPE idempotency.batch_outcome IS
    'Result row of idempotency.begin_batch: the position and key, then the fields of '
    'idempotency.key_outcome';

CREATE FUNCTION idempotency.begin_batch(principal text, keys text[], action text,
                                        fingerprints bytea[], ttl interval DEFAULT NULL,
                                        wait interval DEFAULT NULL)
    RETURNS SETOF idempotency.batch_outcome
    AS 'MODULE_PATHNAME', 'idempotency_begin_batch'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idempotency.begin_batch(text, text[], text, bytea[], interval, interval) IS
    'idempotency.begin for each key (fingerprints[i] is the request of keys[i]): one row per '
    'key in input order; key locks in sorted key order; wait bounds the whole call''s '
    'waiting; at most 1000 keys';

CREATE FUNCTION idempotency.complete_batch(principal text, keys text[], statuses integer[],
                                           bodies bytea[] DEFAULT NULL,
                                           headers jsonb[] DEFAULT NULL,
                                           resource_ids text[] DEFAULT NULL)
    RETURNS TABLE (ord integer, key text, completed boolean)
    AS 'MODULE_PATHNAME', 'idempotency_complete_batch'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idempotency.complete_batch(text, text[], integer[], bytea[], jsonb[], text[])
    IS 'idempotency.complete for each key started by begin or begin_batch in this transaction '
       '(the i-th status, body, headers and resource id for keys[i]); every key is checked '
       'before the first is stored';

CREATE FUNCTION idempotency.claim_batch(principal text, keys text[], ttl interval DEFAULT NULL)
    RETURNS TABLE (ord integer, key text, claimed boolean)
    AS 'MODULE_PATHNAME', 'idempotency_claim_batch'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idempotency.claim_batch(text, text[], interval) IS
    'idempotency.claim for each key: true for the keys this call claimed; key locks in sorted '
    'key order, waiting at most idempotency.wait_timeout in all';

REVOKE ALL ON FUNCTION idempotency.begin_batch(text, text[], text, bytea[], interval, interval)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION
    idempotency.complete_batch(text, text[], integer[], bytea[], jsonb[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.claim_batch(text, text[], interval) FROM PUBLIC;
-- Expiry that says so: expiry policies, tombstones, the expired outcome
-- (issue 25 part 1; docs/sql-reference.md, docs/operations.md)
--
-- An action whose policy is `refuse` keeps a tombstone of each expired key for
-- a grace period: cleanup turns the key's row into state 'expired', with
-- nothing of the response (status, headers, body and resource id NULL, no
-- secret marker), lease_until = when the key expired, and expires_at = when
-- the tombstone goes (that time + grace). Until then the row is live, so no
-- write replaces it and begin()/acquire() answer `expired` (same fingerprint)
-- or `mismatch`; after it, the row is dead and cleanup deletes it like any
-- other, in the order of expires_at. The tombstone lives in the key row and
-- not in a table of its own: a new key's begin() still reads one index entry
-- (none), whatever the policies; only a call that finds a dead row asks for
-- its action's policy.

-- The policies: one row per action that refuses; `run` (the default) is the
-- absence of a row. pg_dump keeps them.
CREATE TABLE idempotency.expiry_policies (
    action    text     NOT NULL CONSTRAINT expiry_policies_pkey PRIMARY KEY,
    on_expiry text     NOT NULL CONSTRAINT expiry_policies_on_expiry_check CHECK (on_expiry = 'refuse'),
    grace     interval NOT NULL CONSTRAINT expiry_policies_grace_check
                                CHECK (grace > interval '0' AND grace <= interval '366 days')
);
COMMENT ON TABLE idempotency.expiry_policies IS
    'Actions whose expired keys are refused (outcome expired) for a grace period instead of forgotten; set with idempotency.set_expiry_policy';
SELECT pg_catalog.pg_extension_config_dump('idempotency.expiry_policies', '');
REVOKE ALL ON TABLE idempotency.expiry_policies FROM PUBLIC;

-- A tombstone is a third state, and keeps nothing of the response.
-- The key table's DDL in this script runs through EXECUTE and can run twice,
-- for Citus: there the key table is distributed, and Citus sends each DDL
-- statement on it to the shards and to the workers' copies of the table as the
-- text it was given (in an extension script: the whole script, which fails),
-- then runs this whole script again on every worker (with its own propagation
-- off), where the workers' copies already have the change. One subcommand a
-- statement: Citus refuses ADD CONSTRAINT beside others. On one node it is the
-- plain ALTER TABLE.
DO $ddl$
BEGIN
    EXECUTE 'ALTER TABLE idempotency.keys DROP CONSTRAINT IF EXISTS keys_state_check';
    EXECUTE 'ALTER TABLE idempotency.keys ADD CONSTRAINT keys_state_check'
            ' CHECK (state = ANY (ARRAY[''in_progress'', ''completed'', ''expired'']))';
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                    WHERE c.conrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass
                      AND c.conname OPERATOR(pg_catalog.=) 'keys_expired_keeps_nothing') THEN
        EXECUTE 'ALTER TABLE idempotency.keys ADD CONSTRAINT keys_expired_keeps_nothing'
                ' CHECK (state <> ''expired'' OR (response_status IS NULL AND response_headers IS NULL'
                ' AND response_body IS NULL AND resource_id IS NULL'
                ' AND NOT one_time_secret AND lease_until IS NOT NULL))';
    END IF;
END
$ddl$;
COMMENT ON COLUMN idempotency.keys.state IS
    'in_progress (lease protocol), completed, or expired (a tombstone: lease_until is when the key expired, expires_at when the tombstone goes)';

CREATE FUNCTION idempotency.set_expiry_policy(action text, on_expiry text,
                                              grace interval DEFAULT interval '7 days')
    RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF action IS NULL THEN
        RAISE EXCEPTION 'action must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF on_expiry IS NULL OR on_expiry NOT IN ('run', 'refuse') THEN
        RAISE EXCEPTION 'on_expiry must be run or refuse, not %', COALESCE(on_expiry, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF grace IS NULL OR grace <= interval '0' OR grace > interval '366 days' THEN
        RAISE EXCEPTION 'grace must be longer than 0 and at most 366 days, not %', COALESCE(grace::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF on_expiry = 'run' THEN
        DELETE FROM idempotency.expiry_policies AS p WHERE p.action = set_expiry_policy.action;
    ELSE
        INSERT INTO idempotency.expiry_policies (action, on_expiry, grace)
        VALUES (set_expiry_policy.action, 'refuse', set_expiry_policy.grace)
        ON CONFLICT ON CONSTRAINT expiry_policies_pkey
            DO UPDATE SET on_expiry = excluded.on_expiry, grace = excluded.grace;
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.set_expiry_policy(text, text, interval) IS
    'Per action: run (default: an expired key is forgotten and may run again) or refuse (cleanup keeps a tombstone until expiry + grace, and a retry gets the outcome expired); 22023 for another on_expiry or a grace outside (0, 366 days]';
REVOKE ALL ON FUNCTION idempotency.set_expiry_policy(text, text, interval) FROM PUBLIC;

-- The index cleanup walks: expires_at cut to 10 ms (date_bin, IMMUTABLE and
-- built in, so that Citus can build the index on the shards before the
-- workers run this script) instead of expires_at itself. Keys that expire in
-- the same 10 ms share one index key, which the B-tree stores once with the
-- list of their rows (deduplication): measured at 7 bytes per key against 23
-- for the index on expires_at (bench/growth/bytes.sh, docs/performance.md).
-- Cleanup takes its batches in the same order as before: by bucket from the
-- index, then by expires_at inside the bucket (an incremental sort of one
-- bucket at a time). The update builds the new index once (a read of the whole
-- table, writes held back meanwhile) and drops the old one; through EXECUTE and
-- able to run twice, for Citus (see the CHECKs above). Each of cleanup's three
-- batch statements below spells the bucket out in full: the planner uses an
-- expression index only for the same expression in the statement, and a helper
-- function would have to be inlined, which the SET search_path that every
-- function of this extension carries prevents.
DO $ddl$
BEGIN
    EXECUTE 'CREATE INDEX IF NOT EXISTS keys_expiry_bucket_idx ON idempotency.keys'
            ' (pg_catalog.date_bin(''00:00:00.01''::pg_catalog.interval, expires_at,'
            ' ''2000-01-01 00:00:00+00''::pg_catalog.timestamptz))';
    EXECUTE 'DROP INDEX IF EXISTS idempotency.keys_expires_at_idx';
END
$ddl$;

-- One batch of cleanup when some action refuses: the batch's dead rows of a
-- refusing action (whose grace has not run out) become tombstones, every
-- other dead row, tombstones past their end included, is deleted. Returns both
-- together as `deleted` (the rows cleanup dealt with, so that the loop of
-- idempotency.cleanup goes on while batches are full) and the latest original
-- expiry among them. Called by cleanup_batch only (runs as the owner).
CREATE FUNCTION idempotency.cleanup_batch_tombstones(batch_size integer, after timestamptz,
                                                     OUT deleted integer, OUT last_expiry timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
    -- By (principal, key) in both placements: a ctid means nothing across
    -- Citus shards, and this path runs only while some action refuses.
    -- The tombstone's times are computed here, not in the UPDATE: Citus refuses
    -- a stable function (timestamptz + interval) over columns in an UPDATE.
    WITH victims AS MATERIALIZED (
        SELECT k.principal, k.key, p.grace, k.expires_at AS expired_at,
               k.expires_at OPERATOR(pg_catalog.+) p.grace AS tombstone_end
          FROM idempotency.keys AS k
          LEFT JOIN idempotency.expiry_policies AS p
            ON p.action OPERATOR(pg_catalog.=) k.action
           AND k.state OPERATOR(pg_catalog.<>) 'expired'
           AND k.expires_at OPERATOR(pg_catalog.+) p.grace OPERATOR(pg_catalog.>) pg_catalog.now()
         WHERE pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                   '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                   OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                   '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                   OPERATOR(pg_catalog.>=)
                   pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval,
                                       COALESCE(after, '-infinity'::pg_catalog.timestamptz),
                                       '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
           AND k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND k.expires_at OPERATOR(pg_catalog.>=) COALESCE(after, '-infinity'::pg_catalog.timestamptz)
           AND (k.lease_until IS NULL OR k.lease_until OPERATOR(pg_catalog.<=) clock)
         ORDER BY pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                      '2000-01-01 00:00:00+00'::pg_catalog.timestamptz),
                  k.expires_at
         LIMIT GREATEST(batch_size, 0)),
    kept AS (
        UPDATE idempotency.keys AS t
           SET state = 'expired', response_status = NULL, response_headers = NULL, response_body = NULL,
               resource_id = NULL, one_time_secret = false, lease_until = v.expired_at,
               expires_at = v.tombstone_end
          FROM victims AS v
         WHERE t.principal OPERATOR(pg_catalog.=) v.principal AND t.key OPERATOR(pg_catalog.=) v.key
           AND v.grace IS NOT NULL AND t.state OPERATOR(pg_catalog.<>) 'expired'
           AND t.expires_at OPERATOR(pg_catalog.=) v.expired_at
           AND t.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND (t.lease_until IS NULL OR t.lease_until OPERATOR(pg_catalog.<=) clock)
        RETURNING t.lease_until AS expiry),
    gone AS (
        DELETE FROM idempotency.keys AS d USING victims AS v
         WHERE d.principal OPERATOR(pg_catalog.=) v.principal AND d.key OPERATOR(pg_catalog.=) v.key
           AND v.grace IS NULL
           AND d.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND (d.lease_until IS NULL OR d.lease_until OPERATOR(pg_catalog.<=) clock)
        RETURNING d.action, d.expires_at AS expiry),
    per_action AS (
        SELECT gone.action, pg_catalog.count(*) AS n FROM gone GROUP BY gone.action),
    counted AS (
        SELECT COALESCE(pg_catalog.sum(p.n), 0) AS n FROM per_action AS p
         WHERE idempotency.count_cleanup(p.action, p.n))
    SELECT ((SELECT c.n FROM counted AS c) OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM kept))::pg_catalog.int4,
           GREATEST((SELECT pg_catalog.max(g.expiry) FROM gone AS g), (SELECT pg_catalog.max(t.expiry) FROM kept AS t))
      INTO deleted, last_expiry;
END
$$;
COMMENT ON FUNCTION idempotency.cleanup_batch_tombstones(integer, timestamptz) IS
    'Used by idempotency.cleanup_batch while some action refuses: one batch of dead keys, those of refusing actions kept as tombstones, the others deleted';
REVOKE ALL ON FUNCTION idempotency.cleanup_batch_tombstones(integer, timestamptz) FROM PUBLIC;

-- cleanup_batch as in 0.6.0, with `after` optional (cleanup_batch(1000) is one
-- batch from the oldest) and, while some action refuses, the batch of
-- cleanup_batch_tombstones instead. With no policy it runs the 0.6.0
-- statements, which now find their batch through keys_expiry_bucket_idx (the
-- bucket bounds beside the expires_at bounds, the order by bucket then
-- expires_at: the same rows in the same order).
CREATE OR REPLACE FUNCTION idempotency.cleanup_batch(batch_size integer, after timestamptz DEFAULT NULL,
                                                     OUT deleted integer, OUT last_expiry timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    distributed boolean := false;
BEGIN
    IF EXISTS (SELECT FROM idempotency.expiry_policies) THEN
        SELECT b.deleted, b.last_expiry INTO deleted, last_expiry
          FROM idempotency.cleanup_batch_tombstones(batch_size, after) AS b;
        RETURN;
    END IF;
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS p'
                '                WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
            INTO distributed USING 'idempotency.keys'::pg_catalog.regclass;
    END IF;
    IF distributed THEN
        -- Citus distributes the table: a ctid means nothing across shards, and
        -- a distributed modification may not call a volatile function, so the
        -- batch is chosen by (principal, key) and the time is a value.
        WITH victims AS MATERIALIZED (
            SELECT k.principal, k.key FROM idempotency.keys AS k
             WHERE pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                       '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                       OPERATOR(pg_catalog.<=) pg_catalog.now()
               AND pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                       '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                       OPERATOR(pg_catalog.>=)
                       pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval,
                                           COALESCE(after, '-infinity'::pg_catalog.timestamptz),
                                           '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
               AND k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
               AND k.expires_at OPERATOR(pg_catalog.>=) COALESCE(after, '-infinity'::pg_catalog.timestamptz)
               AND (k.lease_until IS NULL OR k.lease_until OPERATOR(pg_catalog.<=) clock)
             ORDER BY pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                          '2000-01-01 00:00:00+00'::pg_catalog.timestamptz),
                  k.expires_at
             LIMIT GREATEST(batch_size, 0)),
        gone AS (
            DELETE FROM idempotency.keys AS d USING victims AS v
             WHERE d.principal OPERATOR(pg_catalog.=) v.principal AND d.key OPERATOR(pg_catalog.=) v.key
               AND d.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
               AND (d.lease_until IS NULL OR d.lease_until OPERATOR(pg_catalog.<=) clock)
            RETURNING d.action, d.expires_at),
        per_action AS (
            SELECT gone.action, pg_catalog.count(*) AS n, pg_catalog.max(gone.expires_at) AS last
              FROM gone GROUP BY gone.action)
        SELECT COALESCE(pg_catalog.sum(p.n), 0)::pg_catalog.int4, pg_catalog.max(p.last) INTO deleted, last_expiry
          FROM per_action AS p
         WHERE idempotency.count_cleanup(p.action, p.n);
        RETURN;
    END IF;
    -- PL/pgSQL keeps this statement's plan for the session.
    WITH gone AS (
        DELETE FROM idempotency.keys
         WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                   SELECT k.ctid FROM idempotency.keys AS k
                    WHERE pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                              '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                              OPERATOR(pg_catalog.<=) pg_catalog.now()
                      AND pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                              '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                              OPERATOR(pg_catalog.>=)
                              pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval,
                                                  COALESCE(after, '-infinity'::pg_catalog.timestamptz),
                                                  '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                      AND k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                      AND k.expires_at OPERATOR(pg_catalog.>=)
                          COALESCE(after, '-infinity'::pg_catalog.timestamptz)
                      AND (k.lease_until IS NULL
                           OR k.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
                    ORDER BY pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                                 '2000-01-01 00:00:00+00'::pg_catalog.timestamptz),
                  k.expires_at
                    LIMIT GREATEST(batch_size, 0)))
           AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND (lease_until IS NULL OR lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
        RETURNING action, expires_at),
    per_action AS (
        SELECT gone.action, pg_catalog.count(*) AS n, pg_catalog.max(gone.expires_at) AS last
          FROM gone GROUP BY gone.action)
    SELECT COALESCE(pg_catalog.sum(p.n), 0)::pg_catalog.int4, pg_catalog.max(p.last) INTO deleted, last_expiry
      FROM per_action AS p
     WHERE idempotency.count_cleanup(p.action, p.n);
END
$$;
COMMENT ON FUNCTION idempotency.cleanup_batch(integer, timestamptz) IS
    'Deletes up to batch_size expired keys expiring at or after `after` (NULL or omitted: any), oldest expiry first, or keeps those of a refusing action (idempotency.set_expiry_policy) as tombstones; returns how many and the latest expiry among them. Used by idempotency.cleanup';

-- The counters of the outcome expired, as two columns after stats_reset (the
-- library fills the columns the declaration has: 0.7.0's, or these too). The
-- function and the view are created again; their grants are carried over (a
-- plain table, as in 0.7.0's script: Citus runs this script inside a
-- two-phase commit).
CREATE TABLE idempotency.upgrade_080_grants AS
SELECT 'view' AS kind, a.grantee, a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
 WHERE c.oid OPERATOR(pg_catalog.=) 'idempotency.stats'::pg_catalog.regclass
   AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
UNION ALL
SELECT 'function', a.grantee, a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
 WHERE p.oid OPERATOR(pg_catalog.=) 'idempotency.stats_counters()'::pg_catalog.regprocedure
   AND a.grantee OPERATOR(pg_catalog.<>) p.proowner;

DROP VIEW idempotency.stats;
DROP FUNCTION idempotency.stats_counters();
CREATE FUNCTION idempotency.stats_counters(
        OUT database name, OUT action text,
        OUT begin_started bigint, OUT begin_replay bigint, OUT begin_secret_replay bigint,
        OUT begin_mismatch bigint, OUT begin_in_progress bigint,
        OUT acquire_started bigint, OUT acquire_replay bigint, OUT acquire_secret_replay bigint,
        OUT acquire_mismatch bigint, OUT acquire_in_progress bigint,
        OUT takeovers bigint, OUT completed bigint, OUT lease_completed bigint,
        OUT save_final_stored bigint, OUT save_final_refused bigint, OUT commit_refused bigint,
        OUT serialization_failures bigint, OUT stale_fence bigint, OUT renewed bigint, OUT released bigint,
        OUT cleanup_deleted bigint,
        OUT waits bigint, OUT wait_ms_sum double precision, OUT wait_ms_max double precision,
        OUT wait_le_ms double precision[], OUT wait_buckets bigint[],
        OUT stats_reset timestamptz,
        OUT begin_expired bigint, OUT acquire_expired bigint)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idempotency_stats_counters'
    LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idempotency.stats_counters() IS
    'The counters behind idempotency.stats (needs idempotency in shared_preload_libraries)';
REVOKE ALL ON FUNCTION idempotency.stats_counters() FROM PUBLIC;

CREATE VIEW idempotency.stats AS SELECT * FROM idempotency.stats_counters();
COMMENT ON VIEW idempotency.stats IS
    'What every call did since stats_reset, per database and action: outcomes (expired since 0.8.0), stores, refusals, 40001s, takeovers, stale fences, renewals, cleanup, and the waits for held keys. No key, principal or body';
REVOKE ALL ON idempotency.stats FROM PUBLIC;

DO $grants$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM idempotency.upgrade_080_grants LOOP
        EXECUTE pg_catalog.format('GRANT %s ON %s TO %s%s', g.privilege_type,
            CASE g.kind WHEN 'view' THEN 'idempotency.stats'
                        ELSE 'FUNCTION idempotency.stats_counters()' END,
            CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$grants$;
DROP TABLE idempotency.upgrade_080_grants;

-- distribute() as in 0.6.0, and the policies become a Citus reference table:
-- the functions delegated to the node of a principal's shard read them there.
-- On a cluster distributed before 0.8.0, run SELECT idempotency.distribute()
-- once more after ALTER EXTENSION ... UPDATE (docs/scale-out.md).
CREATE OR REPLACE FUNCTION idempotency.distribute(colocate_with regclass DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fn pg_catalog.regprocedure;
    method text;
    column_name text;
    policies_local boolean;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'idempotency.distribute() needs the citus extension in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'With PL/Proxy or sharding by hand, install idempotency on every shard instead; see docs/scale-out.md.';
    END IF;
    -- Catalogs and functions of Citus, named only once it is there.
    EXECUTE 'SELECT p.partmethod::pg_catalog.text,'
            '       CASE WHEN p.partmethod::pg_catalog.text OPERATOR(pg_catalog.=) $2'
            '            THEN pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) END'
            '  FROM pg_catalog.pg_dist_partition p'
            ' WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1'
        INTO method, column_name USING 'idempotency.keys'::pg_catalog.regclass, 'h';
    IF method IS NULL THEN
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, $2, colocate_with => $3)'
            USING 'idempotency.keys', 'principal', COALESCE(colocate_with::text, 'default');
    ELSIF method IS DISTINCT FROM 'h' OR column_name IS DISTINCT FROM 'principal' THEN
        RAISE EXCEPTION 'idempotency.keys is already distributed, but not by principal'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Undistribute it first: SELECT undistribute_table(''idempotency.keys'').';
    END IF;
    EXECUTE 'SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p'
            '                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
        INTO policies_local USING 'idempotency.expiry_policies'::pg_catalog.regclass;
    IF policies_local THEN
        EXECUTE 'SELECT pg_catalog.create_reference_table($1)' USING 'idempotency.expiry_policies';
    END IF;
    FOR fn IN
        SELECT p.oid::pg_catalog.regprocedure
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
           AND p.proname OPERATOR(pg_catalog.=) ANY ('{begin,complete,save_final,acquire,renew,release,claim,forget,lookup,'
                                                   'begin_batch,complete_batch,claim_batch}')
         ORDER BY p.proname
    LOOP
        EXECUTE 'SELECT pg_catalog.create_distributed_function($1, $2, colocate_with => $3, force_delegation => true)'
            USING fn, '$1', 'idempotency.keys';
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.distribute(regclass) IS
    'Citus: distributes idempotency.keys by principal (co-located with colocate_with, a table distributed by a text column), makes idempotency.expiry_policies a reference table, and delegates every function that names a principal to the node of its shard';
