-- pg_idempotency 0.5.0 -> 0.6.0: guarantees that hold under every interleaving
-- (fences that never repeat, leases that outlive their key's ttl, cleanup that
-- leaves live work alone), one complete() for both protocols, and every object
-- safe under a hostile search_path.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Fences (protocol)

-- Every fence comes from this one sequence: a fence is never handed out twice
-- for a key, not after cleanup or forget deleted its row, a crash, or a dump
-- and restore (the sequence's value is dumped with the extension's data).
-- Until 0.5.0 a fence was the replaced row's + 1 and started again at 1 once
-- a row was gone.
CREATE SEQUENCE idempotency.fences AS bigint;
COMMENT ON SEQUENCE idempotency.fences IS
    'Source of every lease generation (fence) of idempotency.keys; fences never repeat in this database';
-- Above every fence a stored row holds today.
SELECT pg_catalog.setval('idempotency.fences', pg_catalog.max(fence)) FROM idempotency.keys
HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0;
SELECT pg_catalog.pg_extension_config_dump('idempotency.fences', '');
REVOKE ALL ON SEQUENCE idempotency.fences FROM PUBLIC;
ALTER TABLE idempotency.keys
    ALTER COLUMN fence SET DEFAULT pg_catalog.nextval('idempotency.fences'::pg_catalog.regclass);
COMMENT ON COLUMN idempotency.keys.fence IS
    'lease generation, from idempotency.fences: higher at every takeover, never repeated for a key';

-- ---------------------------------------------------------------------------
-- Protocol functions (protocol)

-- Grants that roles hold on functions this script replaces are handed on to
-- the replacements, so that an application keeps working after the update.
-- A plain table, dropped below: Citus runs this script on its workers inside
-- a two-phase commit, which a temporary table would make fail.
CREATE TABLE idempotency.upgrade_060_grants AS
SELECT p.proname::pg_catalog.text AS function, a.grantee, a.is_grantable
  FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
 WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
           'idempotency.complete(text, text, integer, bytea, jsonb, text, boolean)'::pg_catalog.regprocedure,
           'idempotency.complete(text, text, bigint, integer, bytea, jsonb, text, boolean)'::pg_catalog.regprocedure,
           'idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval)'::pg_catalog.regprocedure])
   AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
   AND a.grantee OPERATOR(pg_catalog.<>) p.proowner;

-- One complete() for both protocols: node-pg, psycopg and JDBC send untyped
-- parameters, and two overloads with four leading parameters were ambiguous
-- for them (42725). The lease protocol passes fence => f.
DROP FUNCTION idempotency.complete(text, text, integer, bytea, jsonb, text, boolean);
DROP FUNCTION idempotency.complete(text, text, bigint, integer, bytea, jsonb, text, boolean);
CREATE FUNCTION idempotency.complete(principal text, key text, status integer, body bytea DEFAULT NULL,
                                     headers jsonb DEFAULT NULL, resource_id text DEFAULT NULL,
                                     one_time_secret boolean DEFAULT false, fence bigint DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_complete'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.complete(text, text, integer, bytea, jsonb, text, boolean, bigint) IS
    'Stores the final response. Without fence: of a key started by idempotency.begin in this transaction, committing with it (55000 without a matching begin). With fence: of a key taken by idempotency.acquire, while fence still holds it (false, changing nothing, once exclusivity was lost)';
REVOKE ALL ON FUNCTION idempotency.complete(text, text, integer, bytea, jsonb, text, boolean, bigint) FROM PUBLIC;

-- save_final learns one_time_secret: a final error that carries a secret keeps
-- only its status and the marker, like complete().
DROP FUNCTION idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval);
CREATE FUNCTION idempotency.save_final(principal text, key text, action text, fingerprint bytea,
                                       status integer, body bytea DEFAULT NULL, headers jsonb DEFAULT NULL,
                                       ttl interval DEFAULT NULL, one_time_secret boolean DEFAULT false)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_save_final'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval, boolean) IS
    'After a rolled-back attempt: stores a final error response (true) if no live row holds the key, or does nothing (false: not final, the key is live, or the wait for a transaction holding it ran out)';
REVOKE ALL ON FUNCTION idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval, boolean)
    FROM PUBLIC;

DO $grants$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM idempotency.upgrade_060_grants LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s',
            CASE g.function
                WHEN 'complete' THEN 'idempotency.complete(text, text, integer, bytea, jsonb, text, boolean, bigint)'
                ELSE 'idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval, boolean)'
            END,
            CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$grants$;
DROP TABLE idempotency.upgrade_060_grants;

CREATE FUNCTION idempotency.bound_principal(principal text) RETURNS text
    AS 'MODULE_PATHNAME', 'idempotency_bound_principal'
    LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.bound_principal(text) IS
    'Returns principal when the calling role may act for it under idempotency.principal_binding; 42501 otherwise';

-- A row is live while its key has not expired or a lease holds it.
CREATE OR REPLACE FUNCTION idempotency.lookup(principal text, key text)
    RETURNS TABLE (state text, action text, live boolean, response_status integer, resource_id text,
                   one_time_secret boolean, fence bigint, lease_until timestamptz, created_at timestamptz,
                   expires_at timestamptz)
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Checked first and then compared as a value: Citus routes the query by it.
    bound text := idempotency.bound_principal(lookup.principal);
BEGIN
    RETURN QUERY
    SELECT k.state, k.action,
           k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
               OR COALESCE(k.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(), false),
           k.response_status::pg_catalog.int4, k.resource_id, k.one_time_secret, k.fence, k.lease_until,
           k.created_at, k.expires_at
      FROM idempotency.keys AS k
     WHERE k.principal OPERATOR(pg_catalog.=) bound
       AND k.key OPERATOR(pg_catalog.=) lookup.key;
END
$$;

CREATE OR REPLACE VIEW idempotency.status AS
WITH rows AS (
    SELECT k.*, k.expires_at > pg_catalog.now() OR COALESCE(k.lease_until > pg_catalog.clock_timestamp(), false) AS live
      FROM idempotency.keys AS k),
grouped AS (
    SELECT action, state, live, pg_catalog.count(*) AS keys,
           pg_catalog.min(created_at) AS oldest_created_at, pg_catalog.max(created_at) AS newest_created_at,
           pg_catalog.min(expires_at) AS next_expires_at,
           pg_catalog.count(*) FILTER (WHERE state = 'in_progress' AND lease_until > pg_catalog.clock_timestamp())
               AS leases_live,
           pg_catalog.min(lease_until) FILTER (WHERE state = 'in_progress') AS earliest_lease_until
      FROM rows
     GROUP BY 1, 2, 3),
oldest AS (
    SELECT DISTINCT ON (action, state, live)
           action, state, live, principal AS oldest_principal, key AS oldest_key, lease_until AS oldest_lease_until
      FROM rows
     ORDER BY action, state, live, created_at)
SELECT g.action, g.state, g.live, g.keys, g.oldest_created_at, g.newest_created_at, g.next_expires_at,
       g.leases_live, g.earliest_lease_until, o.oldest_principal, o.oldest_key, o.oldest_lease_until
  FROM grouped g JOIN oldest o USING (action, state, live);

-- Headers: a JSON object of name to value, or an array of [name, value] pairs
-- that keeps their order and repeated names (Set-Cookie, Link). The functions
-- check names (RFC 9110 tokens) and values (no CR, LF or NUL) before storing.
ALTER TABLE idempotency.keys DROP CONSTRAINT keys_response_headers_check,
    ADD CONSTRAINT keys_response_headers_check
        CHECK (pg_catalog.jsonb_typeof(response_headers) = ANY (ARRAY['object', 'array']));
COMMENT ON COLUMN idempotency.keys.response_headers IS
    'headers the application chose to keep: an object of name -> value, or an array of [name, value] pairs (order and repeated names kept)';

-- ---------------------------------------------------------------------------
-- Cleanup (protocol)

DROP FUNCTION idempotency.cleanup_batch(integer);  -- left behind by 0.5.0, unused since

-- cleanup_batch is redefined below, with the counters: a row is deleted only
-- when it is dead (its key expired and no lease holds it).

-- Runs as its caller and cannot fix its search_path (PostgreSQL refuses
-- COMMIT in a procedure with a SET clause), so every type, function and
-- operator in it is schema-qualified: 0.5.0 declared timestamptz bare, and a
-- domain of that name planted in a schema ahead of pg_catalog ran its CHECK
-- as whoever called cleanup.
CREATE OR REPLACE PROCEDURE idempotency.cleanup(batch_size integer DEFAULT NULL, max_runtime interval DEFAULT NULL,
                                                pause interval DEFAULT NULL, INOUT deleted bigint DEFAULT NULL)
    LANGUAGE plpgsql
AS $$
DECLARE
    size pg_catalog.int4 := COALESCE(batch_size,
                                     pg_catalog.current_setting('idempotency.cleanup_batch_size', true)::pg_catalog.int4,
                                     1000);
    started pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    batch pg_catalog.int4;
    resume_at pg_catalog.timestamptz;
    last_expiry pg_catalog.timestamptz;
BEGIN
    IF size OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'batch_size must be positive' USING ERRCODE = '22023';
    END IF;
    IF max_runtime OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION 'max_runtime must not be negative' USING ERRCODE = '22023';
    END IF;
    deleted := 0;
    LOOP
        SELECT b.deleted, b.last_expiry INTO batch, last_expiry
          FROM idempotency.cleanup_batch(size, resume_at) AS b;
        deleted := deleted OPERATOR(pg_catalog.+) batch;
        COMMIT;
        EXIT WHEN batch OPERATOR(pg_catalog.<) size;
        resume_at := last_expiry;
        EXIT WHEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started OPERATOR(pg_catalog.>=) max_runtime;
        IF pause OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN
            PERFORM pg_catalog.pg_sleep(pg_catalog.date_part('epoch', pause));
        END IF;
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------
-- search_path hardening of the remaining objects (security)
-- sql/security_search_path.sql calls every function and procedure under a
-- search_path of traps (and pg_temp traps). Against 0.5.0 only the cleanup
-- procedure fires one (its DECLAREd timestamptz variables, fixed above); every
-- other object pins search_path = pg_catalog, pg_temp or, for the status view,
-- was bound when it was created, so nothing else needs replacing here.

-- ---------------------------------------------------------------------------
-- The C functions run as their caller, with no SET clause

-- SECURITY DEFINER with SET search_path made PostgreSQL save and restore every
-- setting around each call (0.7-0.9 us; a 1 KiB fingerprint took 6.3 us with
-- it, 5.4 without). jcs, fingerprint, is_final and bound_principal touch no
-- table and resolve no name. The protocol functions read and insert key rows
-- directly (PostgreSQL checks no privilege there) and run their few SQL
-- statements with the table owner's rights, switched on in their C code around
-- each statement; every name in those statements is schema-qualified, so the
-- caller's search_path resolves nothing. EXECUTE is still granted per role.
ALTER FUNCTION idempotency.jcs(text) RESET ALL;
ALTER FUNCTION idempotency.jcs(jsonb) RESET ALL;
ALTER FUNCTION idempotency.fingerprint(text, text, bytea, text[]) RESET ALL;
ALTER FUNCTION idempotency.is_final(integer) RESET ALL;
ALTER FUNCTION idempotency.begin(text, text, text, bytea, interval, interval) SECURITY INVOKER RESET ALL;
ALTER FUNCTION idempotency.forget(text, text) SECURITY INVOKER RESET ALL;
ALTER FUNCTION idempotency.acquire(text, text, text, bytea, interval, interval, interval) SECURITY INVOKER RESET ALL;
ALTER FUNCTION idempotency.renew(text, text, bigint, interval) SECURITY INVOKER RESET ALL;
ALTER FUNCTION idempotency.release(text, text, bigint) SECURITY INVOKER RESET ALL;
ALTER FUNCTION idempotency.claim(text, text, interval) SECURITY INVOKER RESET ALL;

-- ---------------------------------------------------------------------------
-- Privileges

-- ---------------------------------------------------------------------------
-- Counters, the stats view and abandoned leases (monitoring)

-- Counters of every call, per database and action, kept in shared memory by
-- the library (src/extension/counters.cpp) when it is in
-- shared_preload_libraries; without it the function warns and returns no rows.
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
        OUT stats_reset timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idempotency_stats_counters'
    LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idempotency.stats_counters() IS
    'The counters behind idempotency.stats (needs idempotency in shared_preload_libraries)';
REVOKE ALL ON FUNCTION idempotency.stats_counters() FROM PUBLIC;

CREATE VIEW idempotency.stats AS SELECT * FROM idempotency.stats_counters();
COMMENT ON VIEW idempotency.stats IS
    'What every call did since stats_reset, per database and action: outcomes, stores, refusals, 40001s, takeovers, stale fences, renewals, cleanup, and the waits for held keys. No key, principal or body';
REVOKE ALL ON idempotency.stats FROM PUBLIC;

CREATE FUNCTION idempotency.stats_reset() RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'idempotency_stats_reset'
    LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idempotency.stats_reset() IS
    'Zeroes every counter of idempotency.stats (all databases) and returns the time of the reset';
REVOKE ALL ON FUNCTION idempotency.stats_reset() FROM PUBLIC;

-- Called by cleanup_batch (SECURITY DEFINER) only.
CREATE FUNCTION idempotency.count_cleanup(action text, deleted bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_count_cleanup'
    LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION idempotency.count_cleanup(text, bigint) IS
    'Adds rows deleted by cleanup to idempotency.stats (used by idempotency.cleanup_batch)';
REVOKE ALL ON FUNCTION idempotency.count_cleanup(text, bigint) FROM PUBLIC;

-- One batch of cleanup. A row is deleted only when it is dead: its key expired
-- and no lease holds it (a lease may outlive its key's ttl). The outer
-- condition is evaluated again on the newest version of a row that a
-- concurrent renew or takeover changed, so such a row is kept. It counts what
-- it deleted, per action.
CREATE OR REPLACE FUNCTION idempotency.cleanup_batch(batch_size integer, after timestamptz,
                                                     OUT deleted integer, OUT last_expiry timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    distributed boolean := false;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS p'
                '                WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
            INTO distributed USING 'idempotency.keys'::pg_catalog.regclass;
    END IF;
    IF distributed THEN
        -- Citus distributes the table: a ctid means nothing across shards, and
        -- a distributed modification may not call a volatile function, so the
        -- batch is chosen by (principal, key) and the time is a value. (On one
        -- node this form took 2.8 times as long as the ctid form below: 0.80
        -- against 0.29 s for 200,000 expired rows in batches of 1,000.)
        WITH victims AS MATERIALIZED (
            SELECT k.principal, k.key FROM idempotency.keys AS k
             WHERE k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
               AND k.expires_at OPERATOR(pg_catalog.>=) COALESCE(after, '-infinity'::pg_catalog.timestamptz)
               AND (k.lease_until IS NULL OR k.lease_until OPERATOR(pg_catalog.<=) clock)
             ORDER BY k.expires_at
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
                    WHERE k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                      AND k.expires_at OPERATOR(pg_catalog.>=)
                          COALESCE(after, '-infinity'::pg_catalog.timestamptz)
                      AND (k.lease_until IS NULL
                           OR k.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
                    ORDER BY k.expires_at
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

-- In-progress work whose lease lapsed (or was released) and that nobody took
-- over. An operator or a worker finishes it with acquire(principal, key,
-- action, fingerprint) (a takeover with a new fence) and complete(..., fence
-- => f), or lets the client retry after release(..., fence => f); see
-- docs/leases.md.
CREATE VIEW idempotency.abandoned AS
SELECT k.principal, k.key, k.action, k.fence,
       CASE WHEN k.lease_until OPERATOR(pg_catalog.=) '-infinity'::pg_catalog.timestamptz THEN NULL
            ELSE k.lease_until END AS abandoned_since,
       k.lease_until OPERATOR(pg_catalog.=) '-infinity'::pg_catalog.timestamptz AS released,
       k.created_at, k.expires_at,
       k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now() AS live,
       k.request_sha256 AS fingerprint
  FROM idempotency.keys AS k
 WHERE k.state OPERATOR(pg_catalog.=) 'in_progress'
   AND k.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp();
COMMENT ON VIEW idempotency.abandoned IS
    'Keys in progress whose lease lapsed or was released and that nobody took over: who, which key and action, the last fence, since when, and the request fingerprint to take them over with';
REVOKE ALL ON idempotency.abandoned FROM PUBLIC;

-- The distributed mode under Citus: the key table distributed by principal,
-- co-located with the application's tables, and every function that names a
-- principal delegated to the node that holds the principal's shard, so that a
-- request's key lock, key row and effects are all on one node. The C functions
-- see from Citus's metadata that the table is distributed and then read and
-- write it by SQL statements, which Citus routes to the local shard.
CREATE FUNCTION idempotency.distribute(colocate_with regclass DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    fn pg_catalog.regprocedure;
    method text;
    column_name text;
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
    FOR fn IN
        SELECT p.oid::pg_catalog.regprocedure
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
           AND p.proname OPERATOR(pg_catalog.=) ANY ('{begin,complete,save_final,acquire,renew,release,claim,forget,lookup}')
         ORDER BY p.proname
    LOOP
        EXECUTE 'SELECT pg_catalog.create_distributed_function($1, $2, colocate_with => $3, force_delegation => true)'
            USING fn, '$1', 'idempotency.keys';
    END LOOP;
END
$$;
COMMENT ON FUNCTION idempotency.distribute(regclass) IS
    'Citus: distributes idempotency.keys by principal (co-located with colocate_with, a table distributed by a text column) and delegates every function that names a principal to the node of its shard';
REVOKE ALL ON FUNCTION idempotency.distribute(regclass) FROM PUBLIC;
