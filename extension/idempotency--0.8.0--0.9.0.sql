-- pg_idempotency 0.8.0 -> 0.9.0: the findings from outside on 0.8.0 (issue 33).
-- The library's own fixes (a fenced completion of a dead row is refused; upper-case
-- UUID keys and header values outside RFC 9110 are refused) need nothing here;
-- set_expiry_policy checks its arguments as the calls it governs do.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.9.0'" to load this file. \quit

-- One validation for every action and every interval: set_expiry_policy asks the
-- library, which applies begin()'s check of an action (1 to 1024 bytes) and the
-- ttl's check to the grace (more than 0 and at most 366 days on the timestamps it
-- gives from now: '12 mon 6 days' is 371 days and refused, as a ttl is since 0.8.0).
CREATE FUNCTION idempotency.check_expiry_policy(action text, grace interval)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idempotency_check_expiry_policy'
    LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION idempotency.check_expiry_policy(text, interval) IS
    'The checks of set_expiry_policy''s arguments: 22023 for an action that begin refuses (empty, '
    'over 1024 bytes) or a grace outside (0, 366 days] on the timestamps it gives';
REVOKE ALL ON FUNCTION idempotency.check_expiry_policy(text, interval) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idempotency.set_expiry_policy(action text, on_expiry text,
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
    'Per action: run (default: an expired key is forgotten and may run again) or refuse (cleanup keeps a tombstone until expiry + grace, and a retry gets the outcome expired); 22023 for another on_expiry, an action that begin refuses, or a grace outside (0, 366 days] on the timestamps it gives';
