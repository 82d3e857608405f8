-- pg_idempotency 0.3.0 -> 0.4.0: cleanup of expired keys, pg_cron scheduling,
-- the status view and the support lookup.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- One batch: the oldest expired rows. No row locks are taken up front (a
-- FOR UPDATE would write a WAL record per row before the delete writes
-- another); a row that a live request is replacing right now makes the
-- DELETE wait for that request, never the other way round, and the
-- re-checked expires_at keeps the replaced row.
CREATE FUNCTION idempotency.cleanup_batch(batch_size integer) RETURNS integer
    LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM idempotency.keys
         WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                   SELECT ctid FROM idempotency.keys
                    WHERE expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                    ORDER BY expires_at
                    LIMIT batch_size))
           AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
        RETURNING 1)
    SELECT pg_catalog.count(*)::integer FROM gone
$$;
COMMENT ON FUNCTION idempotency.cleanup_batch(integer) IS
    'Deletes up to batch_size expired keys, oldest expiry first; returns how many. Used by idempotency.cleanup';

-- The loop commits between batches. PostgreSQL refuses COMMIT in a procedure
-- that has a SET clause or is SECURITY DEFINER, so this one has neither: it
-- runs as its caller and names everything with its schema, operators included.
CREATE PROCEDURE idempotency.cleanup(batch_size integer DEFAULT NULL, max_runtime interval DEFAULT NULL,
                                     pause interval DEFAULT NULL, INOUT deleted bigint DEFAULT NULL)
    LANGUAGE plpgsql
AS $$
DECLARE
    size integer := coalesce(batch_size,
                             pg_catalog.current_setting('idempotency.cleanup_batch_size', true)::integer, 1000);
    started timestamptz := pg_catalog.clock_timestamp();
    batch integer;
BEGIN
    IF size OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'batch_size must be positive' USING ERRCODE = '22023';
    END IF;
    IF max_runtime IS NOT NULL AND max_runtime OPERATOR(pg_catalog.<) interval '0' THEN
        RAISE EXCEPTION 'max_runtime must not be negative' USING ERRCODE = '22023';
    END IF;
    deleted := 0;
    LOOP
        batch := idempotency.cleanup_batch(size);
        deleted := deleted OPERATOR(pg_catalog.+) batch;
        COMMIT;
        EXIT WHEN batch OPERATOR(pg_catalog.<) size;
        EXIT WHEN max_runtime IS NOT NULL
              AND pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started OPERATOR(pg_catalog.>=) max_runtime;
        IF pause IS NOT NULL AND pause OPERATOR(pg_catalog.>) interval '0' THEN
            PERFORM pg_catalog.pg_sleep(pg_catalog.date_part('epoch', pause));
        END IF;
    END LOOP;
END
$$;
COMMENT ON PROCEDURE idempotency.cleanup(integer, interval, interval, bigint) IS
    'Deletes expired keys in batches of batch_size (default idempotency.cleanup_batch_size), oldest first, committing between batches, until a batch is short or max_runtime is spent; sleeps pause between batches; returns the number deleted. CALL it outside a transaction block';

CREATE FUNCTION idempotency.schedule_cleanup(schedule text DEFAULT '* * * * *') RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = 'Install postgresql-15-cron, add pg_cron to shared_preload_libraries, set cron.database_name '
                         'to this database, restart the server and run CREATE EXTENSION pg_cron. Or call '
                         'CALL idempotency.cleanup() from any other scheduler.';
    END IF;
    -- A named job: scheduling again updates it instead of adding a second one.
    RETURN cron.schedule('idempotency:cleanup', schedule, 'CALL idempotency.cleanup(max_runtime => ''50 seconds'')');
END
$$;
COMMENT ON FUNCTION idempotency.schedule_cleanup(text) IS
    'Schedules CALL idempotency.cleanup() as the pg_cron job idempotency:cleanup (default every minute); scheduling again updates the job. 55000 without pg_cron';

CREATE FUNCTION idempotency.unschedule_cleanup() RETURNS boolean
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
AS $$
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
$$;
COMMENT ON FUNCTION idempotency.unschedule_cleanup() IS
    'Removes the pg_cron job idempotency:cleanup; false when it was not scheduled. 55000 without pg_cron';

-- What the store holds, for operators: one row per (action, state, live) with
-- counts, ages, and the oldest key of the group (a full scan: run it on demand,
-- not every second).
CREATE VIEW idempotency.status AS
WITH grouped AS (
    SELECT action, state, expires_at > pg_catalog.now() AS live, pg_catalog.count(*) AS keys,
           pg_catalog.min(created_at) AS oldest_created_at, pg_catalog.max(created_at) AS newest_created_at,
           pg_catalog.min(expires_at) AS next_expires_at,
           pg_catalog.count(*) FILTER (WHERE state = 'in_progress' AND lease_until > pg_catalog.clock_timestamp())
               AS leases_live,
           pg_catalog.min(lease_until) FILTER (WHERE state = 'in_progress') AS earliest_lease_until
      FROM idempotency.keys
     GROUP BY 1, 2, 3),
oldest AS (
    SELECT DISTINCT ON (action, state, expires_at > pg_catalog.now())
           action, state, expires_at > pg_catalog.now() AS live, principal AS oldest_principal, key AS oldest_key,
           lease_until AS oldest_lease_until
      FROM idempotency.keys
     ORDER BY action, state, expires_at > pg_catalog.now(), created_at)
SELECT g.action, g.state, g.live, g.keys, g.oldest_created_at, g.newest_created_at, g.next_expires_at,
       g.leases_live, g.earliest_lease_until, o.oldest_principal, o.oldest_key, o.oldest_lease_until
  FROM grouped g JOIN oldest o USING (action, state, live);
COMMENT ON VIEW idempotency.status IS
    'Keys by action, state and live/expired: counts, ages, leases, and the oldest key of each group';
REVOKE ALL ON idempotency.status FROM PUBLIC;

CREATE FUNCTION idempotency.lookup(principal text, key text)
    RETURNS TABLE (state text, action text, live boolean, response_status integer, resource_id text,
                   one_time_secret boolean, fence bigint, lease_until timestamptz, created_at timestamptz,
                   expires_at timestamptz)
    LANGUAGE sql STABLE STRICT PARALLEL SAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT k.state, k.action, k.expires_at > pg_catalog.now(), k.response_status::integer, k.resource_id,
           k.one_time_secret, k.fence, k.lease_until, k.created_at, k.expires_at
      FROM idempotency.keys AS k
     WHERE k.principal = lookup.principal AND k.key = lookup.key
$$;
COMMENT ON FUNCTION idempotency.lookup(text, text) IS
    'Support tool: one key''s state, status and timestamps, never its body or headers';

REVOKE ALL ON FUNCTION idempotency.cleanup_batch(integer) FROM PUBLIC;
REVOKE ALL ON PROCEDURE idempotency.cleanup(integer, interval, interval, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.schedule_cleanup(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.unschedule_cleanup() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.lookup(text, text) FROM PUBLIC;
