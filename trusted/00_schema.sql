-- The trusted edition's schema: the same objects as the C++ edition's
-- install script leaves (types, the key table and its indexes, the expiry
-- policies), created by the database owner without our library.

CREATE SCHEMA idempotency;
COMMENT ON SCHEMA idempotency IS
    'pg_idempotency, trusted edition (SQL and PL/pgSQL): Idempotency-Key semantics';

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

COMMENT ON TYPE idempotency.batch_outcome IS
    'Result row of idempotency.begin_batch: the position and key, then the fields of '
    'idempotency.key_outcome';

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

COMMENT ON TYPE idempotency.key_outcome IS
    'Result of idempotency.begin: the outcome and, where there is one, the stored response';

CREATE SEQUENCE idempotency.fences
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

COMMENT ON SEQUENCE idempotency.fences IS
    'Fences of the 0.6.0 and 0.7.0 schemas; from 0.8.0 a fence is the clock in microseconds '
    'since 1970 or the row''s fence + 1 (never repeated for a key, across shard moves too); '
    'kept for compatibility';

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
    one_time_secret boolean DEFAULT false NOT NULL,
    fence bigint DEFAULT nextval('idempotency.fences'::regclass) NOT NULL,
    lease_until timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT keys_completed_has_status
        CHECK (state <> 'completed' OR response_status IS NOT NULL),
    CONSTRAINT keys_expired_keeps_nothing
        CHECK (state <> 'expired'
               OR (response_status IS NULL AND response_headers IS NULL AND response_body IS NULL
                   AND resource_id IS NULL AND NOT one_time_secret AND lease_until IS NOT NULL)),
    CONSTRAINT keys_expires_after_created CHECK ((expires_at > created_at)),
    CONSTRAINT keys_fence_check CHECK ((fence > 0)),
    CONSTRAINT keys_request_sha256_check CHECK ((octet_length(request_sha256) = 32)),
    CONSTRAINT keys_response_headers_check
        CHECK (pg_catalog.jsonb_typeof(response_headers) IN ('object', 'array')),
    CONSTRAINT keys_response_status_check
        CHECK (response_status >= 100 AND response_status <= 599),
    CONSTRAINT keys_state_check CHECK (state IN ('in_progress', 'completed', 'expired'))
);

COMMENT ON TABLE idempotency.keys IS
    'Idempotency keys and their stored responses; use the idempotency.* functions, not the '
    'table';

COMMENT ON COLUMN idempotency.keys.principal IS
    'whoever the key belongs to (user, API key, tenant); keys never cross principals';

COMMENT ON COLUMN idempotency.keys.key IS 'the client''s Idempotency-Key';

COMMENT ON COLUMN idempotency.keys.action IS 'the operation, for operators and statistics';

COMMENT ON COLUMN idempotency.keys.request_sha256 IS
    'request fingerprint (idempotency.fingerprint), 32 bytes';

COMMENT ON COLUMN idempotency.keys.state IS
    'in_progress (lease protocol), completed, or expired (a tombstone: lease_until is when '
    'the key expired, expires_at when the tombstone goes)';

COMMENT ON COLUMN idempotency.keys.response_headers IS
    'headers the application chose to keep: an object of name -> value, or an array of '
    '[name, value] pairs (order and repeated names kept)';

COMMENT ON COLUMN idempotency.keys.response_body IS
    'replayed byte for byte; NULL for a one-time secret';

COMMENT ON COLUMN idempotency.keys.one_time_secret IS
    'the response carried a secret and was not stored';

COMMENT ON COLUMN idempotency.keys.fence IS
    'lease generation: the clock in microseconds since 1970 or the previous row''s fence + '
    '1, whichever is higher; higher at every takeover, never repeated for a key, on any node';

COMMENT ON COLUMN idempotency.keys.expires_at IS
    'created_at + TTL; an expired row behaves as absent';

ALTER TABLE ONLY idempotency.keys
    ADD CONSTRAINT keys_pkey PRIMARY KEY (principal, key);

CREATE INDEX keys_expiry_bucket_idx ON idempotency.keys
    USING btree (pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, expires_at,
                                     '2000-01-01 00:00:00+00'::pg_catalog.timestamptz));

CREATE TABLE idempotency.expiry_policies (
    action text NOT NULL,
    on_expiry text NOT NULL,
    grace interval NOT NULL,
    CONSTRAINT expiry_policies_grace_check
        CHECK (grace > '00:00:00'::interval AND grace <= '366 days'::interval),
    CONSTRAINT expiry_policies_on_expiry_check CHECK ((on_expiry = 'refuse'::text))
);

COMMENT ON TABLE idempotency.expiry_policies IS
    'Actions whose expired keys are refused (outcome expired) for a grace period instead of '
    'forgotten; set with idempotency.set_expiry_policy';

ALTER TABLE ONLY idempotency.expiry_policies
    ADD CONSTRAINT expiry_policies_pkey PRIMARY KEY (action);

-- pg_dump keeps the rows of an extension's tables only when they are marked;
-- outside CREATE EXTENSION (psql -f) the tables are ordinary ones and pg_dump
-- dumps them anyway.
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.keys', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.expiry_policies', '');
EXCEPTION WHEN object_not_in_prerequisite_state OR feature_not_supported THEN
    NULL;
END
$$;
