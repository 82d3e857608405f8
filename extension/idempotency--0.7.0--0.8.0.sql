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
