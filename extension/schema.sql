-- pg_idempotency 0.9.0: the schema that CREATE EXTENSION idempotency makes,
-- read back from the server's catalogs by tools/schema.sh (do not edit: CI
-- compares it with a fresh install and with one updated from 0.1.0). The
-- install script itself is extension/idempotency--0.1.0.sql and the update
-- scripts after it; this file is for reading.

CREATE TYPE idempotency.batch_outcome AS (
    ord integer,
    key text,
    outcome text,
    response_status integer,
    response_headers jsonb,
    response_body bytea,
    resource_id text,
    created_at timestamp with time zone,
    expires_at timestamp with time zone,
    fence bigint,
    lease_until timestamp with time zone
);
COMMENT ON TYPE idempotency.batch_outcome IS 'Result row of idempotency.begin_batch: the position and key, then the fields of idempotency.key_outcome';

CREATE TYPE idempotency.key_outcome AS (
    outcome text,
    response_status integer,
    response_headers jsonb,
    response_body bytea,
    resource_id text,
    created_at timestamp with time zone,
    expires_at timestamp with time zone,
    fence bigint,
    lease_until timestamp with time zone
);
COMMENT ON TYPE idempotency.key_outcome IS 'Result of idempotency.begin: the outcome and, where there is one, the stored response';

CREATE SEQUENCE idempotency.fences AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;
COMMENT ON SEQUENCE idempotency.fences IS 'Fences of the 0.6.0 and 0.7.0 schemas; from 0.8.0 a fence is the clock in microseconds since 1970 or the row''s fence + 1 (never repeated for a key, across shard moves too); kept for compatibility';
-- privileges: {owner=rwU/owner}

CREATE TABLE idempotency.expiry_policies (
    action text NOT NULL,
    on_expiry text NOT NULL,
    grace interval NOT NULL,
    CONSTRAINT expiry_policies_grace_check CHECK (((grace > '00:00:00'::interval) AND (grace <= '366 days'::interval))),
    CONSTRAINT expiry_policies_on_expiry_check CHECK ((on_expiry = 'refuse'::text)),
    CONSTRAINT expiry_policies_pkey PRIMARY KEY (action)
);
COMMENT ON TABLE idempotency.expiry_policies IS 'Actions whose expired keys are refused (outcome expired) for a grace period instead of forgotten; set with idempotency.set_expiry_policy';
-- privileges: {owner=arwdDxt/owner}

CREATE TABLE idempotency.keys (
    principal text NOT NULL,
    key text NOT NULL,
    action text NOT NULL,
    request_sha256 bytea NOT NULL,
    state text NOT NULL,
    response_status smallint,
    response_headers jsonb,
    response_body bytea,
    resource_id text,
    one_time_secret boolean NOT NULL DEFAULT false,
    fence bigint NOT NULL DEFAULT nextval('idempotency.fences'::regclass),
    lease_until timestamp with time zone,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT keys_completed_has_status CHECK (((state <> 'completed'::text) OR (response_status IS NOT NULL))),
    CONSTRAINT keys_expired_keeps_nothing CHECK (((state <> 'expired'::text) OR ((response_status IS NULL) AND (response_headers IS NULL) AND (response_body IS NULL) AND (resource_id IS NULL) AND (NOT one_time_secret) AND (lease_until IS NOT NULL)))),
    CONSTRAINT keys_expires_after_created CHECK ((expires_at > created_at)),
    CONSTRAINT keys_fence_check CHECK ((fence > 0)),
    CONSTRAINT keys_pkey PRIMARY KEY (principal, key),
    CONSTRAINT keys_request_sha256_check CHECK ((octet_length(request_sha256) = 32)),
    CONSTRAINT keys_response_headers_check CHECK ((jsonb_typeof(response_headers) = ANY (ARRAY['object'::text, 'array'::text]))),
    CONSTRAINT keys_response_status_check CHECK (((response_status >= 100) AND (response_status <= 599))),
    CONSTRAINT keys_state_check CHECK ((state = ANY (ARRAY['in_progress'::text, 'completed'::text, 'expired'::text])))
);
CREATE INDEX keys_expiry_bucket_idx ON idempotency.keys USING btree (date_bin('00:00:00.01'::interval, expires_at, '2000-01-01 00:00:00+00'::timestamp with time zone));
COMMENT ON TABLE idempotency.keys IS 'Idempotency keys and their stored responses; use the idempotency.* functions, not the table';
COMMENT ON COLUMN idempotency.keys.principal IS 'whoever the key belongs to (user, API key, tenant); keys never cross principals';
COMMENT ON COLUMN idempotency.keys.key IS 'the client''s Idempotency-Key';
COMMENT ON COLUMN idempotency.keys.action IS 'the operation, for operators and statistics';
COMMENT ON COLUMN idempotency.keys.request_sha256 IS 'request fingerprint (idempotency.fingerprint), 32 bytes';
COMMENT ON COLUMN idempotency.keys.state IS 'in_progress (lease protocol), completed, or expired (a tombstone: lease_until is when the key expired, expires_at when the tombstone goes)';
COMMENT ON COLUMN idempotency.keys.response_headers IS 'headers the application chose to keep: an object of name -> value, or an array of [name, value] pairs (order and repeated names kept)';
COMMENT ON COLUMN idempotency.keys.response_body IS 'replayed byte for byte; NULL for a one-time secret';
COMMENT ON COLUMN idempotency.keys.one_time_secret IS 'the response carried a secret and was not stored';
COMMENT ON COLUMN idempotency.keys.fence IS 'lease generation: the clock in microseconds since 1970 or the previous row''s fence + 1, whichever is higher; higher at every takeover, never repeated for a key, on any node';
COMMENT ON COLUMN idempotency.keys.expires_at IS 'created_at + TTL; an expired row behaves as absent';
-- privileges: {owner=arwdDxt/owner}

CREATE VIEW idempotency.abandoned AS
 SELECT k.principal, k.key, k.action, k.fence,
        CASE
            WHEN k.lease_until = '-infinity'::timestamp with time zone THEN NULL::timestamp with time zone
            ELSE k.lease_until
        END AS abandoned_since,
    k.lease_until = '-infinity'::timestamp with time zone AS released, k.created_at, k.expires_at,
    k.expires_at > now() AS live, k.request_sha256 AS fingerprint
   FROM idempotency.keys k
  WHERE k.state = 'in_progress'::text AND k.lease_until <= clock_timestamp();
COMMENT ON VIEW idempotency.abandoned IS 'Keys in progress whose lease lapsed or was released and that nobody took over: who, which key and action, the last fence, since when, and the request fingerprint to take them over with';
-- privileges: {owner=arwdDxt/owner}

CREATE VIEW idempotency.oldest_keys AS
 SELECT DISTINCT ON (k.action, k.state, k.live) k.action, k.state, k.live, k.principal, k.key,
    k.created_at, k.expires_at, k.lease_until
   FROM ( SELECT r.principal, r.key, r.action, r.request_sha256, r.state, r.response_status,
            r.response_headers, r.response_body, r.resource_id, r.one_time_secret, r.fence,
            r.lease_until, r.created_at, r.expires_at,
            r.expires_at > now() OR COALESCE(r.lease_until > clock_timestamp(), false) AS live
           FROM idempotency.keys r) k
  ORDER BY k.action, k.state, k.live, k.created_at, k.principal, k.key;
COMMENT ON VIEW idempotency.oldest_keys IS 'The oldest key of each (action, state, live) group of idempotency.status, with its principal: for the operator and support roles, not for monitoring';
-- privileges: {owner=arwdDxt/owner}

CREATE VIEW idempotency.stats AS
 SELECT stats_counters.database, stats_counters.action, stats_counters.begin_started,
    stats_counters.begin_replay, stats_counters.begin_secret_replay, stats_counters.begin_mismatch,
    stats_counters.begin_in_progress, stats_counters.acquire_started, stats_counters.acquire_replay,
    stats_counters.acquire_secret_replay, stats_counters.acquire_mismatch,
    stats_counters.acquire_in_progress, stats_counters.takeovers, stats_counters.completed,
    stats_counters.lease_completed, stats_counters.save_final_stored,
    stats_counters.save_final_refused, stats_counters.commit_refused,
    stats_counters.serialization_failures, stats_counters.stale_fence, stats_counters.renewed,
    stats_counters.released, stats_counters.cleanup_deleted, stats_counters.waits,
    stats_counters.wait_ms_sum, stats_counters.wait_ms_max, stats_counters.wait_le_ms,
    stats_counters.wait_buckets, stats_counters.stats_reset, stats_counters.begin_expired,
    stats_counters.acquire_expired
   FROM idempotency.stats_counters() stats_counters(database, action, begin_started, begin_replay, begin_secret_replay, begin_mismatch, begin_in_progress, acquire_started, acquire_replay, acquire_secret_replay, acquire_mismatch, acquire_in_progress, takeovers, completed, lease_completed, save_final_stored, save_final_refused, commit_refused, serialization_failures, stale_fence, renewed, released, cleanup_deleted, waits, wait_ms_sum, wait_ms_max, wait_le_ms, wait_buckets, stats_reset, begin_expired, acquire_expired);
COMMENT ON VIEW idempotency.stats IS 'What every call did since stats_reset, per database and action: outcomes (expired since 0.8.0), stores, refusals, 40001s, takeovers, stale fences, renewals, cleanup, and the waits for held keys. No key, principal or body';
-- privileges: {owner=arwdDxt/owner}

CREATE VIEW idempotency.status AS
 SELECT k.action, k.state,
    k.expires_at > now() OR COALESCE(k.lease_until > clock_timestamp(), false) AS live,
    count(*) AS keys, min(k.created_at) AS oldest_created_at, max(k.created_at) AS newest_created_at,
    min(k.expires_at) AS next_expires_at,
    count(*) FILTER (WHERE k.state = 'in_progress'::text AND k.lease_until > clock_timestamp()) AS leases_live,
    min(k.lease_until) FILTER (WHERE k.state = 'in_progress'::text) AS earliest_lease_until
   FROM idempotency.keys k
  GROUP BY k.action, k.state, (k.expires_at > now() OR COALESCE(k.lease_until > clock_timestamp(), false));
COMMENT ON VIEW idempotency.status IS 'Keys by action, state and live/expired: counts and times only, never a principal or a key (the oldest key of each group is in idempotency.oldest_keys)';
-- privileges: {owner=arwdDxt/owner}

CREATE OR REPLACE FUNCTION idempotency.acquire(principal text, key text, action text, fingerprint bytea, lease interval DEFAULT NULL::interval, ttl interval DEFAULT NULL::interval, wait interval DEFAULT NULL::interval)
 RETURNS idempotency.key_outcome
 LANGUAGE c
AS '$libdir/idempotency', $function$idempotency_acquire$function$;
COMMENT ON FUNCTION idempotency.acquire(text,text,text,bytea,interval,interval,interval) IS 'Lease protocol: takes (principal, key) with an in_progress row held for lease (default idempotency.lease); started returns the fence; an expired lease is taken over with fence + 1. Commit right after the call';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.begin(principal text, key text, action text, fingerprint bytea, ttl interval DEFAULT NULL::interval, wait interval DEFAULT NULL::interval)
 RETURNS idempotency.key_outcome
 LANGUAGE c
AS '$libdir/idempotency', $function$idempotency_begin$function$;
COMMENT ON FUNCTION idempotency.begin(text,text,text,bytea,interval,interval) IS 'Claims (principal, key) for this transaction: started (run the handler, then complete), replay, secret_replay, mismatch, or in_progress after waiting up to wait (default idempotency.wait_timeout) for another transaction that holds the key';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.begin_batch(principal text, keys text[], action text, fingerprints bytea[], ttl interval DEFAULT NULL::interval, wait interval DEFAULT NULL::interval)
 RETURNS SETOF idempotency.batch_outcome
 LANGUAGE c
 ROWS 100
AS '$libdir/idempotency', $function$idempotency_begin_batch$function$;
COMMENT ON FUNCTION idempotency.begin_batch(text,text[],text,bytea[],interval,interval) IS 'idempotency.begin for each key (fingerprints[i] is the request of keys[i]): one row per key in input order; key locks in sorted key order; wait bounds the whole call''s waiting; at most 1000 keys';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.bound_principal(principal text)
 RETURNS text
 LANGUAGE c
 STABLE PARALLEL SAFE STRICT
AS '$libdir/idempotency', $function$idempotency_bound_principal$function$;
COMMENT ON FUNCTION idempotency.bound_principal(text) IS 'Returns principal when the calling role may act for it under idempotency.principal_binding; 42501 otherwise';
-- privileges: the default (EXECUTE for PUBLIC)

CREATE OR REPLACE FUNCTION idempotency.check_expiry_policy(action text, grace interval)
 RETURNS void
 LANGUAGE c
 STABLE PARALLEL SAFE
AS '$libdir/idempotency', $function$idempotency_check_expiry_policy$function$;
COMMENT ON FUNCTION idempotency.check_expiry_policy(text,interval) IS 'The checks of set_expiry_policy''s arguments: 22023 for an action that begin refuses (empty, over 1024 bytes) or a grace outside (0, 366 days] on the timestamps it gives';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.claim(principal text, key text, ttl interval DEFAULT NULL::interval)
 RETURNS boolean
 LANGUAGE c
AS '$libdir/idempotency', $function$idempotency_claim$function$;
COMMENT ON FUNCTION idempotency.claim(text,text,interval) IS 'At-most-once marker: true for the first caller within ttl (default idempotency.key_ttl), false for every other';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.claim_batch(principal text, keys text[], ttl interval DEFAULT NULL::interval)
 RETURNS TABLE(ord integer, key text, claimed boolean)
 LANGUAGE c
 ROWS 100
AS '$libdir/idempotency', $function$idempotency_claim_batch$function$;
COMMENT ON FUNCTION idempotency.claim_batch(text,text[],interval) IS 'idempotency.claim for each key: true for the keys this call claimed; key locks in sorted key order, waiting at most idempotency.wait_timeout in all';
-- privileges: {owner=X/owner}

CREATE OR REPLACE PROCEDURE idempotency.cleanup(IN batch_size integer DEFAULT NULL::integer, IN max_runtime interval DEFAULT NULL::interval, IN pause interval DEFAULT NULL::interval, INOUT deleted bigint DEFAULT NULL::bigint)
 LANGUAGE plpgsql
AS $procedure$
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
$procedure$;
COMMENT ON PROCEDURE idempotency.cleanup(integer,interval,interval,bigint) IS 'Deletes expired keys in batches of batch_size (default idempotency.cleanup_batch_size), oldest first, committing between batches, until a batch is short or max_runtime is spent; sleeps pause between batches; returns the number deleted. CALL it outside a transaction block';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.cleanup_batch(batch_size integer, after timestamp with time zone DEFAULT NULL::timestamp with time zone, OUT deleted integer, OUT last_expiry timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$;
COMMENT ON FUNCTION idempotency.cleanup_batch(integer,timestamp with time zone) IS 'Deletes up to batch_size expired keys expiring at or after `after` (NULL or omitted: any), oldest expiry first, or keeps those of a refusing action (idempotency.set_expiry_policy) as tombstones; returns how many and the latest expiry among them. Used by idempotency.cleanup';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.cleanup_batch_tombstones(batch_size integer, after timestamp with time zone, OUT deleted integer, OUT last_expiry timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
           -- The row this batch chose, not a newer one written in its place while
           -- the DELETE waited for it (a takeover of a dead row, which the next
           -- batch judges afresh: a refusing action's key becomes a tombstone).
           AND d.expires_at OPERATOR(pg_catalog.=) v.expired_at
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
$function$;
COMMENT ON FUNCTION idempotency.cleanup_batch_tombstones(integer,timestamp with time zone) IS 'Used by idempotency.cleanup_batch while some action refuses: one batch of dead keys, those of refusing actions kept as tombstones, the others deleted';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.complete(principal text, key text, status integer, body bytea DEFAULT NULL::bytea, headers jsonb DEFAULT NULL::jsonb, resource_id text DEFAULT NULL::text, one_time_secret boolean DEFAULT false, fence bigint DEFAULT NULL::bigint)
 RETURNS boolean
 LANGUAGE c
AS '$libdir/idempotency', $function$idempotency_complete$function$;
COMMENT ON FUNCTION idempotency.complete(text,text,integer,bytea,jsonb,text,boolean,bigint) IS 'Stores the final response. Without fence: of a key started by idempotency.begin in this transaction, committing with it (55000 without a matching begin). With fence: of a key taken by idempotency.acquire, while fence still holds it (false, changing nothing, once exclusivity was lost)';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.complete_batch(principal text, keys text[], statuses integer[], bodies bytea[] DEFAULT NULL::bytea[], headers jsonb[] DEFAULT NULL::jsonb[], resource_ids text[] DEFAULT NULL::text[])
 RETURNS TABLE(ord integer, key text, completed boolean)
 LANGUAGE c
 ROWS 100
AS '$libdir/idempotency', $function$idempotency_complete_batch$function$;
COMMENT ON FUNCTION idempotency.complete_batch(text,text[],integer[],bytea[],jsonb[],text[]) IS 'idempotency.complete for each key started by begin or begin_batch in this transaction (the i-th status, body, headers and resource id for keys[i]); every key is checked before the first is stored';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.count_cleanup(action text, deleted bigint)
 RETURNS boolean
 LANGUAGE c
 STRICT
AS '$libdir/idempotency', $function$idempotency_count_cleanup$function$;
COMMENT ON FUNCTION idempotency.count_cleanup(text,bigint) IS 'Adds rows deleted by cleanup to idempotency.stats (used by idempotency.cleanup_batch)';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.distribute(colocate_with regclass DEFAULT NULL::regclass)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$;
COMMENT ON FUNCTION idempotency.distribute(regclass) IS 'Citus: distributes idempotency.keys by principal (co-located with colocate_with, a table distributed by a text column), makes idempotency.expiry_policies a reference table, and delegates every function that names a principal to the node of its shard';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.fingerprint(method text, path text, body bytea DEFAULT NULL::bytea, exclude text[] DEFAULT NULL::text[])
 RETURNS bytea
 LANGUAGE c
 IMMUTABLE PARALLEL SAFE
AS '$libdir/idempotency', $function$idempotency_fingerprint$function$;
COMMENT ON FUNCTION idempotency.fingerprint(text,text,bytea,text[]) IS 'SHA-256 of upper(method) || LF || path || LF || body, the body in RFC 8785 form when it is JSON (raw bytes otherwise), minus the members named by the RFC 6901 pointers in exclude';
-- privileges: the default (EXECUTE for PUBLIC)

CREATE OR REPLACE FUNCTION idempotency.forget(principal text, key text)
 RETURNS boolean
 LANGUAGE c
 STRICT
AS '$libdir/idempotency', $function$idempotency_forget$function$;
COMMENT ON FUNCTION idempotency.forget(text,text) IS 'Operator tool: removes one key (true if a row was deleted)';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.http_answer(result idempotency.batch_outcome, type_base text DEFAULT '/problems/'::text, retry_after integer DEFAULT 1, OUT status integer, OUT headers jsonb, OUT body bytea)
 RETURNS record
 LANGUAGE sql
 PARALLEL SAFE
 SET search_path TO 'pg_catalog', 'pg_temp'
RETURN idempotency.http_answer(ROW((result).outcome, (result).response_status, (result).response_headers, (result).response_body, (result).resource_id, (result).created_at, (result).expires_at, (result).fence, (result).lease_until)::idempotency.key_outcome, type_base, retry_after);
COMMENT ON FUNCTION idempotency.http_answer(idempotency.batch_outcome,text,integer) IS 'idempotency.http_answer of one row of begin_batch';
-- privileges: the default (EXECUTE for PUBLIC)

CREATE OR REPLACE FUNCTION idempotency.http_answer(result idempotency.key_outcome, type_base text DEFAULT '/problems/'::text, retry_after integer DEFAULT 1, OUT status integer, OUT headers jsonb, OUT body bytea)
 RETURNS record
 LANGUAGE plpgsql
 PARALLEL SAFE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    kind text;  -- the problem of client/protocol.json
    title text;
    detail text;
    slug text;
    replayed boolean := false;
    stored jsonb := result.response_headers;
    expires jsonb := '[]';
    seconds integer;
BEGIN
    IF result.outcome IS NULL THEN
        RAISE EXCEPTION 'the outcome must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF type_base IS NULL OR retry_after IS NULL THEN
        RAISE EXCEPTION 'type_base and retry_after must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF result.outcome = 'started' THEN
        RETURN;  -- the handler runs: no answer yet (status, headers and body NULL)
    END IF;
    -- Every answer tells the key's expiry (an IMF-fixdate, RFC 9110), never stored.
    IF result.expires_at IS NOT NULL THEN
        expires := jsonb_build_array(jsonb_build_array('Idempotency-Expires',
            to_char(result.expires_at AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "GMT"')));
    END IF;
    CASE result.outcome
    WHEN 'replay' THEN
        IF jsonb_typeof(stored) = 'array' THEN
            -- Pairs of two strings, in their order (repeated names kept).
            SELECT coalesce(jsonb_agg(p ORDER BY n), '[]') INTO headers
              FROM jsonb_array_elements(stored) WITH ORDINALITY AS e(p, n)
             WHERE jsonb_typeof(p) = 'array' AND jsonb_array_length(p) = 2
               AND jsonb_typeof(p -> 0) = 'string' AND jsonb_typeof(p -> 1) = 'string';
        ELSIF jsonb_typeof(stored) = 'object' THEN
            -- The object form of 0.1.0-0.5.0: names in byte order.
            SELECT coalesce(jsonb_agg(jsonb_build_array(k, v) ORDER BY k COLLATE "C"), '[]')
                   INTO headers
              FROM jsonb_each(stored) AS e(k, v)
             WHERE jsonb_typeof(v) = 'string';
        ELSE
            headers := '[]';
        END IF;
        IF EXISTS (SELECT FROM jsonb_array_elements(headers) AS e(p)
                    WHERE lower((p ->> 0) COLLATE "C") = ':not_kept') THEN
            kind := 'response_not_kept';
            replayed := true;
        ELSE
            -- The marker and the expiry are the answer's own: set once, at the end.
            SELECT coalesce(jsonb_agg(p ORDER BY n), '[]') INTO headers
              FROM jsonb_array_elements(headers) WITH ORDINALITY AS e(p, n)
             WHERE lower((p ->> 0) COLLATE "C") NOT IN ('idempotent-replay', 'idempotency-expires');
            status := result.response_status;
            headers := headers || '[["Idempotent-Replay", "true"]]' || expires;
            body := coalesce(result.response_body, '\x'::bytea);
            RETURN;
        END IF;
    WHEN 'secret_replay' THEN
        kind := 'one_time_secret';
        replayed := true;
    WHEN 'mismatch' THEN
        kind := 'key_reuse';
    WHEN 'in_progress' THEN
        kind := 'request_in_progress';
    WHEN 'expired' THEN
        kind := 'key_expired';
    ELSE
        RAISE EXCEPTION 'unknown outcome "%"', result.outcome USING ERRCODE = '22023';
    END CASE;
    SELECT t.status, t.slug, t.title, t.detail INTO status, slug, title, detail
      FROM (VALUES
        ('key_reuse', 422, 'idempotency-key-reuse', 'Idempotency-Key was used for another request',
         'This Idempotency-Key was used for a different request; use a new key for a new request.'),
        ('request_in_progress', 409, 'request-in-progress',
         'A request with this Idempotency-Key is in progress',
         'A request with this Idempotency-Key is still being processed; retry later.'),
        ('one_time_secret', 409, 'one-time-secret',
         'The response to this request was sent once and not kept',
         'The first response to this request carried a secret and was not kept; create a new one '
         'with a new key.'),
        ('response_not_kept', 409, 'response-not-kept',
         'The response to this request was too large to keep',
         'The first response to this request was streamed and was larger than this service '
         'keeps; it was sent once and not stored. Use a new key for a new request.'),
        ('key_expired', 410, 'idempotency-key-expired', 'Idempotency-Key has expired',
         'This Idempotency-Key expired and its response is no longer kept; the request was not '
         'run again. Use a new key for a new request.')
      ) AS t(problem, status, slug, title, detail)
     WHERE t.problem = kind;
    body := convert_to('{"detail":' || to_json(detail)::text || ',"status":' || status::text
                       || ',"title":' || to_json(title)::text || ',"type":'
                       || to_json(type_base || slug)::text || '}', 'UTF8');
    headers := '[["Content-Type", "application/problem+json"]]';
    IF replayed THEN
        headers := headers || '[["Idempotent-Replay", "true"]]';
    END IF;
    IF kind = 'request_in_progress' THEN
        -- Under a lease: when it runs out; else the caller's retry_after (at least 1).
        seconds := greatest(1, retry_after);
        IF result.lease_until IS NOT NULL THEN
            seconds := greatest(1, ceil(extract(epoch FROM result.lease_until - clock_timestamp()))::integer);
        END IF;
        headers := headers || jsonb_build_array(jsonb_build_array('Retry-After', seconds::text));
    END IF;
    headers := headers || expires;
END
$function$;
COMMENT ON FUNCTION idempotency.http_answer(idempotency.key_outcome,text,integer) IS 'The HTTP answer of an outcome that does not run the handler: replay (the stored status, kept headers and body, Idempotent-Replay, Idempotency-Expires), mismatch 422, in_progress 409 with Retry-After, secret_replay and a response not kept 409, expired 410, as RFC 9457 problems under type_base; started: all NULL (run the handler). Headers are [name, value] pairs in order; a name starting with ":" (":chunks") is the client''s instruction, not a header';
-- privileges: the default (EXECUTE for PUBLIC)

CREATE OR REPLACE FUNCTION idempotency.http_storage(status integer)
 RETURNS text
 LANGUAGE plpgsql
 STABLE PARALLEL SAFE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF status IS NULL OR status < 100 OR status > 599 THEN
        RAISE EXCEPTION 'an HTTP status is 100 to 599, not %', coalesce(status::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF NOT idempotency.is_final(status) THEN
        RETURN 'not_stored';
    END IF;
    RETURN CASE WHEN status >= 400 THEN 'saved_after_rollback' ELSE 'committed_with_key' END;
END
$function$;
COMMENT ON FUNCTION idempotency.http_storage(integer) IS 'What a handler''s response with this status does: committed_with_key (final, below 400), saved_after_rollback (final error: roll back, then save_final), not_stored (not final per idempotency.final_statuses: roll back, a retry runs); 22023 outside 100-599';
-- privileges: the default (EXECUTE for PUBLIC)

CREATE OR REPLACE FUNCTION idempotency.is_final(status integer)
 RETURNS boolean
 LANGUAGE c
 STABLE PARALLEL SAFE STRICT
AS '$libdir/idempotency', $function$idempotency_is_final$function$;
COMMENT ON FUNCTION idempotency.is_final(integer) IS 'Whether a response with this status is stored and replayed, per idempotency.final_statuses';
-- privileges: the default (EXECUTE for PUBLIC)

CREATE OR REPLACE FUNCTION idempotency.jcs(document jsonb)
 RETURNS text
 LANGUAGE c
 IMMUTABLE PARALLEL SAFE STRICT
AS '$libdir/idempotency', $function$idempotency_jcs_jsonb$function$;
COMMENT ON FUNCTION idempotency.jcs(jsonb) IS 'RFC 8785 canonical form of a jsonb value (numerics rounded to the nearest double); same bytes as idempotency.jcs(text) for the same document';
-- privileges: the default (EXECUTE for PUBLIC)

CREATE OR REPLACE FUNCTION idempotency.jcs(document text)
 RETURNS text
 LANGUAGE c
 IMMUTABLE PARALLEL SAFE STRICT
AS '$libdir/idempotency', $function$idempotency_jcs_text$function$;
COMMENT ON FUNCTION idempotency.jcs(text) IS 'RFC 8785 canonical form of a JSON text; rejects invalid JSON or UTF-8 (22P02), duplicate names, lone surrogates and numbers beyond a double (22032), nesting deeper than idempotency.max_json_depth (54000)';
-- privileges: the default (EXECUTE for PUBLIC)

CREATE OR REPLACE FUNCTION idempotency.lookup(principal text, key text)
 RETURNS TABLE(state text, action text, live boolean, response_status integer, resource_id text, one_time_secret boolean, fence bigint, lease_until timestamp with time zone, created_at timestamp with time zone, expires_at timestamp with time zone)
 LANGUAGE plpgsql
 STABLE PARALLEL SAFE STRICT SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$;
COMMENT ON FUNCTION idempotency.lookup(text,text) IS 'Support tool: one key''s state, status and timestamps, never its body or headers';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.release(principal text, key text, fence bigint)
 RETURNS boolean
 LANGUAGE c
 STRICT
AS '$libdir/idempotency', $function$idempotency_release$function$;
COMMENT ON FUNCTION idempotency.release(text,text,bigint) IS 'Lease protocol: ends the lease of fence so that a retry may run again (the row stays, so fences never repeat)';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.renew(principal text, key text, fence bigint, lease interval DEFAULT NULL::interval)
 RETURNS boolean
 LANGUAGE c
AS '$libdir/idempotency', $function$idempotency_renew$function$;
COMMENT ON FUNCTION idempotency.renew(text,text,bigint,interval) IS 'Lease protocol: extends the lease of the holder of fence; false when the fence no longer matches (the lease was lost)';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.save_final(principal text, key text, action text, fingerprint bytea, status integer, body bytea DEFAULT NULL::bytea, headers jsonb DEFAULT NULL::jsonb, ttl interval DEFAULT NULL::interval, one_time_secret boolean DEFAULT false)
 RETURNS boolean
 LANGUAGE c
AS '$libdir/idempotency', $function$idempotency_save_final$function$;
COMMENT ON FUNCTION idempotency.save_final(text,text,text,bytea,integer,bytea,jsonb,interval,boolean) IS 'After a rolled-back attempt: stores a final error response (true) if no live row holds the key, or does nothing (false: not final, the key is live, or the wait for a transaction holding it ran out)';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.schedule_cleanup(schedule text DEFAULT '* * * * *'::text)
 RETURNS bigint
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = pg_catalog.format(
                      'Install postgresql-%s-cron (Debian; pg_cron for PostgreSQL %s elsewhere), add pg_cron '
                      'to shared_preload_libraries, set cron.database_name to this database, restart the '
                      'server and run CREATE EXTENSION pg_cron. Or call CALL idempotency.cleanup() from '
                      'any other scheduler.',
                      pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog./) 10000,
                      pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog./) 10000);
    END IF;
    -- A named job: scheduling again updates it instead of adding a second one.
    RETURN cron.schedule('idempotency:cleanup', schedule, 'CALL idempotency.cleanup(max_runtime => ''50 seconds'')');
END
$function$;
COMMENT ON FUNCTION idempotency.schedule_cleanup(text) IS 'Schedules CALL idempotency.cleanup() as the pg_cron job idempotency:cleanup (default every minute); scheduling again updates the job. 55000 without pg_cron';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.set_expiry_policy(action text, on_expiry text, grace interval DEFAULT '7 days'::interval)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF action IS NULL THEN
        RAISE EXCEPTION 'action must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF on_expiry IS NULL OR on_expiry NOT IN ('run', 'refuse') THEN
        RAISE EXCEPTION 'on_expiry must be run or refuse, not %', COALESCE(on_expiry, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF grace IS NULL THEN
        RAISE EXCEPTION 'grace must not be NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM idempotency.check_expiry_policy(set_expiry_policy.action, set_expiry_policy.grace);
    IF on_expiry = 'run' THEN
        DELETE FROM idempotency.expiry_policies AS p WHERE p.action = set_expiry_policy.action;
    ELSE
        INSERT INTO idempotency.expiry_policies (action, on_expiry, grace)
        VALUES (set_expiry_policy.action, 'refuse', set_expiry_policy.grace)
        ON CONFLICT ON CONSTRAINT expiry_policies_pkey
            DO UPDATE SET on_expiry = excluded.on_expiry, grace = excluded.grace;
    END IF;
END
$function$;
COMMENT ON FUNCTION idempotency.set_expiry_policy(text,text,interval) IS 'Per action: run (default: an expired key is forgotten and may run again) or refuse (cleanup keeps a tombstone until expiry + grace, and a retry gets the outcome expired); 22023 for another on_expiry, an action that begin refuses, or a grace outside (0, 366 days] on the timestamps it gives';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.stats_counters(OUT database name, OUT action text, OUT begin_started bigint, OUT begin_replay bigint, OUT begin_secret_replay bigint, OUT begin_mismatch bigint, OUT begin_in_progress bigint, OUT acquire_started bigint, OUT acquire_replay bigint, OUT acquire_secret_replay bigint, OUT acquire_mismatch bigint, OUT acquire_in_progress bigint, OUT takeovers bigint, OUT completed bigint, OUT lease_completed bigint, OUT save_final_stored bigint, OUT save_final_refused bigint, OUT commit_refused bigint, OUT serialization_failures bigint, OUT stale_fence bigint, OUT renewed bigint, OUT released bigint, OUT cleanup_deleted bigint, OUT waits bigint, OUT wait_ms_sum double precision, OUT wait_ms_max double precision, OUT wait_le_ms double precision[], OUT wait_buckets bigint[], OUT stats_reset timestamp with time zone, OUT begin_expired bigint, OUT acquire_expired bigint)
 RETURNS SETOF record
 LANGUAGE c
AS '$libdir/idempotency', $function$idempotency_stats_counters$function$;
COMMENT ON FUNCTION idempotency.stats_counters() IS 'The counters behind idempotency.stats (needs idempotency in shared_preload_libraries)';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.stats_reset()
 RETURNS timestamp with time zone
 LANGUAGE c
AS '$libdir/idempotency', $function$idempotency_stats_reset$function$;
COMMENT ON FUNCTION idempotency.stats_reset() IS 'Zeroes every counter of idempotency.stats (all databases) and returns the time of the reset';
-- privileges: {owner=X/owner}

CREATE OR REPLACE FUNCTION idempotency.unschedule_cleanup()
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = 'Nothing is scheduled without pg_cron; see idempotency.schedule_cleanup().';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM cron.job WHERE jobname = 'idempotency:cleanup') THEN
        RETURN false;
    END IF;
    RETURN cron.unschedule('idempotency:cleanup');
END
$function$;
COMMENT ON FUNCTION idempotency.unschedule_cleanup() IS 'Removes the pg_cron job idempotency:cleanup; false when it was not scheduled. 55000 without pg_cron';
-- privileges: {owner=X/owner}
