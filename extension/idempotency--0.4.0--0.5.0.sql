-- pg_idempotency 0.4.0 -> 0.5.0: cleanup resumes each batch where the last one
-- stopped.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- One batch of the oldest expired rows whose expiry is `after` or later (NULL:
-- from the oldest). Deleted rows leave their index entries behind until VACUUM,
-- so a batch that always started from the oldest expiry walked over every
-- entry deleted so far: cleanup cost grew with the square of the backlog (1M
-- keys in batches of 250: 12.6 s; resuming: 1.7 s). Returns how many rows it
-- deleted and the latest expiry among them, where the next batch starts (rows
-- with that same expiry that did not fit are taken then).
CREATE FUNCTION idempotency.cleanup_batch(batch_size integer, after timestamptz,
                                          OUT deleted integer, OUT last_expiry timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL keeps this statement's plan for the session; a LANGUAGE sql
    -- function would plan it again for every batch (about 1 ms, more than
    -- deleting 100 rows).
    WITH gone AS (
        DELETE FROM idempotency.keys
         WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                   SELECT k.ctid FROM idempotency.keys AS k
                    WHERE k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                      AND k.expires_at OPERATOR(pg_catalog.>=) COALESCE(after, '-infinity'::pg_catalog.timestamptz)
                    ORDER BY k.expires_at
                    LIMIT GREATEST(batch_size, 0)))
           AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
        RETURNING expires_at)
    SELECT pg_catalog.count(*)::integer, pg_catalog.max(gone.expires_at) INTO deleted, last_expiry FROM gone;
END
$$;
COMMENT ON FUNCTION idempotency.cleanup_batch(integer, timestamptz) IS
    'Deletes up to batch_size expired keys expiring at or after `after` (NULL: any), oldest expiry first; returns how many and the latest expiry deleted. Used by idempotency.cleanup';
REVOKE ALL ON FUNCTION idempotency.cleanup_batch(integer, timestamptz) FROM PUBLIC;

-- The same loop as in 0.4.0, each batch resuming at the previous one's latest
-- expiry. A row that expires before that point but was still in use when its
-- batch ran is left to the next CALL, which starts from the oldest again.
CREATE OR REPLACE PROCEDURE idempotency.cleanup(batch_size integer DEFAULT NULL, max_runtime interval DEFAULT NULL,
                                                pause interval DEFAULT NULL, INOUT deleted bigint DEFAULT NULL)
    LANGUAGE plpgsql
AS $$
DECLARE
    size integer := coalesce(batch_size,
                             pg_catalog.current_setting('idempotency.cleanup_batch_size', true)::integer, 1000);
    started timestamptz := pg_catalog.clock_timestamp();
    batch integer;
    resume_at timestamptz;
    last_expiry timestamptz;
BEGIN
    IF size OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'batch_size must be positive' USING ERRCODE = '22023';
    END IF;
    IF max_runtime IS NOT NULL AND max_runtime OPERATOR(pg_catalog.<) interval '0' THEN
        RAISE EXCEPTION 'max_runtime must not be negative' USING ERRCODE = '22023';
    END IF;
    deleted := 0;
    LOOP
        SELECT b.deleted, b.last_expiry INTO batch, last_expiry FROM idempotency.cleanup_batch(size, resume_at) AS b;
        deleted := deleted OPERATOR(pg_catalog.+) batch;
        COMMIT;
        EXIT WHEN batch OPERATOR(pg_catalog.<) size;
        resume_at := last_expiry;
        EXIT WHEN max_runtime IS NOT NULL
              AND pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started OPERATOR(pg_catalog.>=) max_runtime;
        IF pause IS NOT NULL AND pause OPERATOR(pg_catalog.>) interval '0' THEN
            PERFORM pg_catalog.pg_sleep(pg_catalog.date_part('epoch', pause));
        END IF;
    END LOOP;
END
$$;
