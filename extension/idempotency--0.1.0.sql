-- pg_idempotency 0.1.0: canonical JSON and request fingerprints.
-- Frozen: released scripts never change; later releases add upgrade scripts.
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Canonical JSON (RFC 8785) and request fingerprints

CREATE FUNCTION idempotency.jcs(document text) RETURNS text
    AS 'MODULE_PATHNAME', 'idempotency_jcs_text'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.jcs(text) IS
    'RFC 8785 canonical form of a JSON text; rejects invalid JSON or UTF-8 (22P02), duplicate names, lone surrogates and numbers beyond a double (22032), nesting deeper than idempotency.max_json_depth (54000)';

CREATE FUNCTION idempotency.jcs(document jsonb) RETURNS text
    AS 'MODULE_PATHNAME', 'idempotency_jcs_jsonb'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.jcs(jsonb) IS
    'RFC 8785 canonical form of a jsonb value (numerics rounded to the nearest double); same bytes as idempotency.jcs(text) for the same document';

CREATE FUNCTION idempotency.fingerprint(method text, path text, body bytea DEFAULT NULL,
                                        exclude text[] DEFAULT NULL) RETURNS bytea
    AS 'MODULE_PATHNAME', 'idempotency_fingerprint'
    LANGUAGE C IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION idempotency.fingerprint(text, text, bytea, text[]) IS
    'SHA-256 of upper(method) || LF || path || LF || body, the body in RFC 8785 form when it is JSON (raw bytes otherwise), minus the members named by the RFC 6901 pointers in exclude';
