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
