-- pg_idempotency 0.1.0 -> 0.2.0: the key store and the transactional protocol.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Key store

CREATE TABLE idempotency.keys (
    principal        text        NOT NULL,
    key              text        NOT NULL,
    action           text        NOT NULL,
    request_sha256   bytea       NOT NULL CONSTRAINT keys_request_sha256_check CHECK (octet_length(request_sha256) = 32),
    state            text        NOT NULL CONSTRAINT keys_state_check CHECK (state IN ('in_progress', 'completed')),
    response_status  smallint    CONSTRAINT keys_response_status_check CHECK (response_status BETWEEN 100 AND 599),
    response_headers jsonb       CONSTRAINT keys_response_headers_check CHECK (jsonb_typeof(response_headers) = 'object'),
    response_body    bytea,
    resource_id      text,
    one_time_secret  boolean     NOT NULL DEFAULT false,
    fence            bigint      NOT NULL DEFAULT 1 CONSTRAINT keys_fence_check CHECK (fence > 0),
    lease_until      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT pg_catalog.now(),
    expires_at       timestamptz NOT NULL,
    CONSTRAINT keys_pkey PRIMARY KEY (principal, key),
    CONSTRAINT keys_completed_has_status CHECK (state <> 'completed' OR response_status IS NOT NULL),
    CONSTRAINT keys_expires_after_created CHECK (expires_at > created_at)
);
CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at);
COMMENT ON TABLE idempotency.keys IS
    'Idempotency keys and their stored responses; use the idempotency.* functions, not the table';
COMMENT ON COLUMN idempotency.keys.principal IS 'whoever the key belongs to (user, API key, tenant); keys never cross principals';
COMMENT ON COLUMN idempotency.keys.key IS 'the client''s Idempotency-Key';
COMMENT ON COLUMN idempotency.keys.action IS 'the operation, for operators and statistics';
COMMENT ON COLUMN idempotency.keys.request_sha256 IS 'request fingerprint (idempotency.fingerprint), 32 bytes';
COMMENT ON COLUMN idempotency.keys.state IS 'in_progress (lease protocol) or completed';
COMMENT ON COLUMN idempotency.keys.response_headers IS 'headers the application chose to keep, name -> value';
COMMENT ON COLUMN idempotency.keys.response_body IS 'replayed byte for byte; NULL for a one-time secret';
COMMENT ON COLUMN idempotency.keys.one_time_secret IS 'the response carried a secret and was not stored';
COMMENT ON COLUMN idempotency.keys.fence IS 'lease generation; grows by one at every takeover';
COMMENT ON COLUMN idempotency.keys.expires_at IS 'created_at + TTL; an expired row behaves as absent';

-- pg_dump keeps live keys with the data of the database.
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');

-- Applications go through the functions below (SECURITY DEFINER), never the table.
REVOKE ALL ON TABLE idempotency.keys FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- The transactional protocol

CREATE TYPE idempotency.key_outcome AS (
    outcome          text,         -- started, replay, mismatch, in_progress, secret_replay
    response_status  integer,      -- stored status (replay, secret_replay)
    response_headers jsonb,        -- stored headers (replay)
    response_body    bytea,        -- stored body (replay)
    resource_id      text,         -- stored resource id (replay, mismatch)
    created_at       timestamptz,  -- when the key was first used (or now, for started)
    expires_at       timestamptz,  -- when the key stops counting
    fence            bigint,       -- lease generation of the row (started: the one complete will write)
    lease_until      timestamptz   -- in_progress under a lease: when it runs out
);
COMMENT ON TYPE idempotency.key_outcome IS
    'Result of idempotency.begin: the outcome and, where there is one, the stored response';

CREATE FUNCTION idempotency.begin(principal text, key text, action text, fingerprint bytea,
                                  ttl interval DEFAULT NULL, wait interval DEFAULT NULL)
    RETURNS idempotency.key_outcome
    AS 'MODULE_PATHNAME', 'idempotency_begin'
    LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.begin(text, text, text, bytea, interval, interval) IS
    'Claims (principal, key) for this transaction: started (run the handler, then complete), replay, secret_replay, mismatch, or in_progress after waiting up to wait (default idempotency.wait_timeout) for another transaction that holds the key';

CREATE FUNCTION idempotency.complete(principal text, key text, status integer, body bytea DEFAULT NULL,
                                     headers jsonb DEFAULT NULL, resource_id text DEFAULT NULL,
                                     one_time_secret boolean DEFAULT false)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_complete'
    LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.complete(text, text, integer, bytea, jsonb, text, boolean) IS
    'Stores the final response of a key started by idempotency.begin in this transaction; commits with the transaction (55000 without a matching begin)';

CREATE FUNCTION idempotency.save_final(principal text, key text, action text, fingerprint bytea,
                                       status integer, body bytea DEFAULT NULL, headers jsonb DEFAULT NULL,
                                       ttl interval DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_save_final'
    LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval) IS
    'After a rolled-back attempt: stores a final error response if the key is absent (true) or does nothing (false: not final, or the key is taken)';

CREATE FUNCTION idempotency.is_final(status integer) RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_is_final'
    LANGUAGE C STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.is_final(integer) IS
    'Whether a response with this status is stored and replayed, per idempotency.final_statuses';

CREATE FUNCTION idempotency.forget(principal text, key text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempotency_forget'
    LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.forget(text, text) IS
    'Operator tool: removes one key (true if a row was deleted)';

-- The protocol functions write the key store as the extension owner; only
-- roles granted EXECUTE (see docs/sql-reference.md) may call them.
REVOKE ALL ON FUNCTION idempotency.begin(text, text, text, bytea, interval, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.complete(text, text, integer, bytea, jsonb, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.forget(text, text) FROM PUBLIC;
