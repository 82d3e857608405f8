-- Cleanup, expiry policies, pg_cron, support lookup, and what the trusted
-- edition cannot do (counters, Citus), failing closed.

CREATE FUNCTION idempotency.check_expiry_policy(action text, grace interval)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF action IS NULL OR octet_length(action) = 0 OR octet_length(action) > 1024 THEN
        RAISE EXCEPTION 'action must be 1 to 1024 bytes long' USING ERRCODE = '22023';
    END IF;
    IF grace IS NULL OR abs(extract(year FROM grace) * 12 + extract(month FROM grace)) > 120000
       OR abs(extract(day FROM grace)) > 3660000
       OR abs(extract(epoch FROM grace - date_trunc('day', grace))) > 3660000::numeric * 86400
       OR now() + grace <= now() OR now() + grace > now() + interval '366 days' THEN
        RAISE EXCEPTION 'grace must be more than 0 and at most 366 days'
            USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_expiry_policy(text, interval) IS
    'The checks of set_expiry_policy''s arguments: 22023 for an action begin refuses or a '
    'grace outside (0, 366 days] on the timestamps it gives';

CREATE FUNCTION idempotency.set_expiry_policy(action text, on_expiry text,
                                              grace interval DEFAULT '7 days')
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF action IS NULL THEN
        RAISE EXCEPTION 'action must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF on_expiry IS NULL OR on_expiry NOT IN ('run', 'refuse') THEN
        RAISE EXCEPTION 'on_expiry must be run or refuse, not %', coalesce(on_expiry, 'NULL')
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
$$;
COMMENT ON FUNCTION idempotency.set_expiry_policy(text, text, interval) IS
    'Per action: run (default: an expired key is forgotten and may run again) or refuse '
    '(cleanup keeps a tombstone until expiry + grace, and a retry gets the outcome expired)';

-- The counters need the library's shared memory: off, as the C++ edition is
-- without shared_preload_libraries (a WARNING, no rows).
CREATE FUNCTION idempotency.stats_counters(
    OUT database name, OUT action text, OUT begin_started bigint, OUT begin_replay bigint,
    OUT begin_secret_replay bigint, OUT begin_mismatch bigint, OUT begin_in_progress bigint,
    OUT acquire_started bigint, OUT acquire_replay bigint, OUT acquire_secret_replay bigint,
    OUT acquire_mismatch bigint, OUT acquire_in_progress bigint, OUT takeovers bigint,
    OUT completed bigint, OUT lease_completed bigint, OUT save_final_stored bigint,
    OUT save_final_refused bigint, OUT commit_refused bigint,
    OUT serialization_failures bigint, OUT stale_fence bigint, OUT renewed bigint,
    OUT released bigint, OUT cleanup_deleted bigint, OUT waits bigint,
    OUT wait_ms_sum double precision, OUT wait_ms_max double precision,
    OUT wait_le_ms double precision[], OUT wait_buckets bigint[],
    OUT stats_reset timestamptz, OUT begin_expired bigint, OUT acquire_expired bigint)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE WARNING 'idempotency counters are off'
        USING HINT = 'The trusted edition has no shared memory: the counters need the C++ '
                     'edition with idempotency in shared_preload_libraries.';
END
$$;
COMMENT ON FUNCTION idempotency.stats_counters() IS
    'The counters behind idempotency.stats (trusted edition: off, a WARNING and no rows)';

CREATE FUNCTION idempotency.stats_reset()
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE WARNING 'idempotency counters are off'
        USING HINT = 'The trusted edition has no shared memory: the counters need the C++ '
                     'edition with idempotency in shared_preload_libraries.';
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION idempotency.stats_reset() IS
    'Zeroes every counter of idempotency.stats (trusted edition: off, NULL with a WARNING)';

CREATE FUNCTION idempotency.count_cleanup(action text, deleted bigint)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT
SET search_path = pg_catalog, pg_temp
RETURN true;
COMMENT ON FUNCTION idempotency.count_cleanup(text, bigint) IS
    'Adds rows deleted by cleanup to idempotency.stats (trusted edition: no counters, true)';

CREATE FUNCTION idempotency.distribute(colocate_with regclass DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'idempotency.distribute() needs the C++ edition'
        USING ERRCODE = '0A000',
              HINT = 'The trusted edition runs on one node; Citus needs the library.';
END
$$;
COMMENT ON FUNCTION idempotency.distribute(regclass) IS
    'Citus: distributes idempotency.keys by principal (trusted edition: 0A000)';

-- One batch: the statement of the C++ edition's local placement.
CREATE FUNCTION idempotency.cleanup_batch(batch_size integer,
                                          after timestamptz DEFAULT NULL,
                                          OUT deleted integer, OUT last_expiry timestamptz)
RETURNS record
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    start timestamptz := coalesce(after, '-infinity');
BEGIN
    IF EXISTS (SELECT FROM idempotency.expiry_policies) THEN
        SELECT b.deleted, b.last_expiry INTO deleted, last_expiry
          FROM idempotency.cleanup_batch_tombstones(batch_size, after) AS b;
        RETURN;
    END IF;
    WITH gone AS (
        DELETE FROM idempotency.keys
         WHERE ctid = ANY (ARRAY(
                   SELECT k.ctid FROM idempotency.keys AS k
                    WHERE date_bin('10 ms', k.expires_at, '2000-01-01 00:00+00') <= now()
                      AND date_bin('10 ms', k.expires_at, '2000-01-01 00:00+00')
                          >= date_bin('10 ms', start, '2000-01-01 00:00+00')
                      AND k.expires_at <= now() AND k.expires_at >= start
                      AND (k.lease_until IS NULL OR k.lease_until <= clock_timestamp())
                    ORDER BY date_bin('10 ms', k.expires_at, '2000-01-01 00:00+00'),
                             k.expires_at
                    LIMIT greatest(batch_size, 0)))
           AND expires_at <= now()
           AND (lease_until IS NULL OR lease_until <= clock_timestamp())
        RETURNING expires_at)
    SELECT count(*)::integer, max(gone.expires_at) INTO deleted, last_expiry FROM gone;
END
$$;
COMMENT ON FUNCTION idempotency.cleanup_batch(integer, timestamptz) IS
    'Deletes up to batch_size expired keys expiring at or after `after` (NULL: any), oldest '
    'expiry first, or keeps those of a refusing action as tombstones; returns how many and '
    'the latest expiry among them. Used by idempotency.cleanup';

CREATE FUNCTION idempotency.cleanup_batch_tombstones(batch_size integer, after timestamptz,
                                                     OUT deleted integer,
                                                     OUT last_expiry timestamptz)
RETURNS record
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock timestamptz := clock_timestamp();
    start timestamptz := coalesce(after, '-infinity');
BEGIN
    WITH victims AS MATERIALIZED (
        SELECT k.principal, k.key, p.grace, k.expires_at AS expired_at,
               k.expires_at + p.grace AS tombstone_end
          FROM idempotency.keys AS k
          LEFT JOIN idempotency.expiry_policies AS p
            ON p.action = k.action AND k.state <> 'expired' AND k.expires_at + p.grace > now()
         WHERE date_bin('10 ms', k.expires_at, '2000-01-01 00:00+00') <= now()
           AND date_bin('10 ms', k.expires_at, '2000-01-01 00:00+00')
               >= date_bin('10 ms', start, '2000-01-01 00:00+00')
           AND k.expires_at <= now() AND k.expires_at >= start
           AND (k.lease_until IS NULL OR k.lease_until <= clock)
         ORDER BY date_bin('10 ms', k.expires_at, '2000-01-01 00:00+00'), k.expires_at
         LIMIT greatest(batch_size, 0)),
    kept AS (
        UPDATE idempotency.keys AS t
           SET state = 'expired', response_status = NULL, response_headers = NULL,
               response_body = NULL, resource_id = NULL, one_time_secret = false,
               lease_until = v.expired_at, expires_at = v.tombstone_end
          FROM victims AS v
         WHERE t.principal = v.principal AND t.key = v.key
           AND v.grace IS NOT NULL AND t.state <> 'expired'
           AND t.expires_at = v.expired_at AND t.expires_at <= now()
           AND (t.lease_until IS NULL OR t.lease_until <= clock)
        RETURNING t.lease_until AS expiry),
    gone AS (
        DELETE FROM idempotency.keys AS d USING victims AS v
         WHERE d.principal = v.principal AND d.key = v.key AND v.grace IS NULL
           -- The row version the batch chose, not a newer one a takeover wrote in
           -- its place meanwhile (the next batch judges that one afresh).
           AND d.expires_at = v.expired_at
           AND d.expires_at <= now() AND (d.lease_until IS NULL OR d.lease_until <= clock)
        RETURNING d.expires_at AS expiry)
    SELECT ((SELECT count(*) FROM gone) + (SELECT count(*) FROM kept))::integer,
           greatest((SELECT max(g.expiry) FROM gone AS g), (SELECT max(t.expiry) FROM kept AS t))
      INTO deleted, last_expiry;
END
$$;
COMMENT ON FUNCTION idempotency.cleanup_batch_tombstones(integer, timestamptz) IS
    'Used by idempotency.cleanup_batch while some action refuses: one batch of dead keys, '
    'those of refusing actions kept as tombstones, the others deleted';

-- No SET clause (PostgreSQL refuses COMMIT in a procedure with one): every
-- name is qualified instead.
CREATE PROCEDURE idempotency.cleanup(batch_size integer DEFAULT NULL,
                                     max_runtime interval DEFAULT NULL,
                                     pause interval DEFAULT NULL,
                                     INOUT deleted bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    size pg_catalog.int4 := COALESCE(batch_size, idempotency.setting_int(
                                'idempotency.cleanup_batch_size', 1000, 1, 1000000));
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
        EXIT WHEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started
                  OPERATOR(pg_catalog.>=) max_runtime;
        IF pause OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN
            PERFORM pg_catalog.pg_sleep(pg_catalog.date_part('epoch', pause));
        END IF;
    END LOOP;
END
$$;
COMMENT ON PROCEDURE idempotency.cleanup(integer, interval, interval, bigint) IS
    'Deletes expired keys in batches of batch_size (default idempotency.cleanup_batch_size), '
    'oldest first, committing between batches, until a batch is short or max_runtime is '
    'spent; sleeps pause between batches; returns the number deleted. CALL it outside a '
    'transaction block';

CREATE FUNCTION idempotency.schedule_cleanup(schedule text DEFAULT '* * * * *')
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = format(
                      'Install postgresql-%s-cron (Debian; pg_cron for PostgreSQL %s elsewhere; '
                      'on a managed service enable pg_cron in its parameters), set '
                      'cron.database_name to this database and run CREATE EXTENSION pg_cron. '
                      'Or call CALL idempotency.cleanup() from any other scheduler.',
                      current_setting('server_version_num')::integer / 10000,
                      current_setting('server_version_num')::integer / 10000);
    END IF;
    -- A named job: scheduling again updates it instead of adding a second one.
    RETURN cron.schedule('idempotency:cleanup', schedule,
                         'CALL idempotency.cleanup(max_runtime => ''50 seconds'')');
END
$$;
COMMENT ON FUNCTION idempotency.schedule_cleanup(text) IS
    'Schedules CALL idempotency.cleanup() as the pg_cron job idempotency:cleanup (default '
    'every minute); scheduling again updates the job. 55000 without pg_cron';

CREATE FUNCTION idempotency.unschedule_cleanup()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = 'Nothing is scheduled without pg_cron; see '
                         'idempotency.schedule_cleanup().';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM cron.job WHERE jobname = 'idempotency:cleanup') THEN
        RETURN false;
    END IF;
    RETURN cron.unschedule('idempotency:cleanup');
END
$$;
COMMENT ON FUNCTION idempotency.unschedule_cleanup() IS
    'Removes the pg_cron job idempotency:cleanup; false when it was not scheduled. 55000 '
    'without pg_cron';

CREATE FUNCTION idempotency.lookup(principal text, key text)
RETURNS TABLE (state text, action text, live boolean, response_status integer,
               resource_id text, one_time_secret boolean, fence bigint,
               lease_until timestamptz, created_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql STABLE STRICT SECURITY DEFINER PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound text := idempotency.bound_principal(lookup.principal);
BEGIN
    RETURN QUERY
    SELECT k.state, k.action,
           k.expires_at > now() OR coalesce(k.lease_until > clock_timestamp(), false),
           k.response_status::integer, k.resource_id, k.one_time_secret, k.fence,
           k.lease_until, k.created_at, k.expires_at
      FROM idempotency.keys AS k
     WHERE k.principal = bound AND k.key = lookup.key;
END
$$;
COMMENT ON FUNCTION idempotency.lookup(text, text) IS
    'Support tool: one key''s state, status and timestamps, never its body or headers';
