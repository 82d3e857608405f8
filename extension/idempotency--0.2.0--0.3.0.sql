-- pg_idempotency 0.2.0 -> 0.3.0: the lease protocol, for effects outside the database.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

CREATE FUNCTION idempotency.acquire(principal text, key text, action text, fingerprint bytea,
                                    lease interval DEFAULT NULL, ttl interval DEFAULT NULL,
                                    wait interval DEFAULT NULL)
    RETURNS idempotency.key_outcome
    AS 'MODULE_PATHNAME', 'idempotency_acquire'
    LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.acquire(text, text, text, bytea, interval, interval, interval) IS
    'Lease protocol: takes (principal, key) with an in_progress row held for lease (default idempotency.lease); started returns the fence; an expired lease is taken over with fence + 1. Commit right after the call';

CREATE FUNCTION idempotency.renew(principal text, key text, fence bigint, lease interval DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_renew'
    LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.renew(text, text, bigint, interval) IS
    'Lease protocol: extends the lease of the holder of fence; false when the fence no longer matches (the lease was lost)';

CREATE FUNCTION idempotency.complete(principal text, key text, fence bigint, status integer,
                                     body bytea DEFAULT NULL, headers jsonb DEFAULT NULL,
                                     resource_id text DEFAULT NULL, one_time_secret boolean DEFAULT false)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_complete_fenced'
    LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.complete(text, text, bigint, integer, bytea, jsonb, text, boolean) IS
    'Lease protocol: stores the response while fence still holds the key (true); false, changing nothing, when exclusivity was lost';

CREATE FUNCTION idempotency.release(principal text, key text, fence bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_release'
    LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.release(text, text, bigint) IS
    'Lease protocol: ends the lease of fence so that a retry may run again (the row stays, so fences never repeat)';

CREATE FUNCTION idempotency.claim(principal text, key text, ttl interval DEFAULT NULL) RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_claim'
    LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.claim(text, text, interval) IS
    'At-most-once marker: true for the first caller within ttl (default idempotency.key_ttl), false for every other';

REVOKE ALL ON FUNCTION idempotency.acquire(text, text, text, bytea, interval, interval, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.renew(text, text, bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete(text, text, bigint, integer, bytea, jsonb, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.release(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.claim(text, text, interval) FROM PUBLIC;
