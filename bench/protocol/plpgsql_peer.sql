-- A PL/pgSQL peer of idempotency.begin / idempotency.complete, written the way
-- application libraries usually do it: begin() claims the key by inserting an
-- in_progress row (INSERT ... ON CONFLICT DO NOTHING) and otherwise looks the
-- existing row up (replay, mismatch, in_progress); complete() UPDATEs that row
-- to completed with the response. Same protocol, same transaction shape:
--
--   BEGIN;
--   SELECT * FROM peer.begin(principal, key, action, fingerprint);   -- 'started'
--   ... the handler's writes ...
--   SELECT peer.complete(principal, key, status, body, headers, resource_id);
--   COMMIT;
--
-- A duplicate that arrives while the first transaction is open blocks on the
-- uncommitted in_progress row (the ON CONFLICT arbiter waits for it), then sees
-- the committed row and replays, or inserts its own row if the first rolled
-- back. Every keyed request writes its row twice (insert, then update), so it
-- leaves one dead tuple behind (or a HOT chain that pruning must clean).
--
-- Deliberate simplifications, all in the peer's favour or neutral for the
-- benchmark: no SECURITY DEFINER / SET search_path (the extension's functions
-- carry both), `wait` is accepted but ignored (a duplicate blocks until the
-- holder ends), no enforcement of "complete before COMMIT" (PL/pgSQL has no
-- transaction callbacks), no final-status list (any 100..599 is stored).
-- Stand-alone: it does not need the extension.

CREATE SCHEMA peer;

-- The same shape as idempotency.keys.
CREATE TABLE peer.keys (
    principal        text        NOT NULL,
    key              text        NOT NULL,
    action           text        NOT NULL,
    request_sha256   bytea       NOT NULL CHECK (octet_length(request_sha256) = 32),
    state            text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    response_status  smallint    CHECK (response_status BETWEEN 100 AND 599),
    response_headers jsonb       CHECK (jsonb_typeof(response_headers) = 'object'),
    response_body    bytea,
    resource_id      text,
    one_time_secret  boolean     NOT NULL DEFAULT false,
    fence            bigint      NOT NULL DEFAULT 1 CHECK (fence > 0),
    lease_until      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (principal, key),
    CHECK (state <> 'completed' OR response_status IS NOT NULL),
    CHECK (expires_at > created_at)
);
CREATE INDEX keys_expires_at_idx ON peer.keys (expires_at);

CREATE TYPE peer.key_outcome AS (
    outcome          text,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    resource_id      text,
    created_at       timestamptz,
    expires_at       timestamptz,
    fence            bigint,
    lease_until      timestamptz
);

CREATE FUNCTION peer.begin(p_principal text, p_key text, p_action text, p_fingerprint bytea,
                           p_ttl interval DEFAULT NULL, p_wait interval DEFAULT NULL)
    RETURNS peer.key_outcome
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ttl   interval := coalesce(p_ttl, interval '1 day');
    r       peer.keys;
    o       peer.key_outcome;
BEGIN
    IF p_principal IS NULL OR p_key IS NULL OR p_action IS NULL OR p_fingerprint IS NULL THEN
        RAISE EXCEPTION 'principal, key, action and fingerprint must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_key = '' OR octet_length(p_key) > 255 THEN
        RAISE EXCEPTION 'idempotency key must be 1 to 255 bytes long' USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_fingerprint) <> 32 THEN
        RAISE EXCEPTION 'fingerprint must be 32 bytes (SHA-256)' USING ERRCODE = '22023';
    END IF;

    -- Claim the key. Blocks while another transaction holds an uncommitted row.
    INSERT INTO peer.keys AS k (principal, key, action, request_sha256, state, created_at, expires_at)
    VALUES (p_principal, p_key, p_action, p_fingerprint, 'in_progress', now(), now() + v_ttl)
    ON CONFLICT (principal, key) DO NOTHING;
    IF FOUND THEN
        o.outcome := 'started';
        o.created_at := now();
        o.expires_at := now() + v_ttl;
        o.fence := 1;
        RETURN o;
    END IF;

    -- The key exists (READ COMMITTED: a fresh snapshot sees the committed row).
    SELECT * INTO r FROM peer.keys k WHERE k.principal = p_principal AND k.key = p_key;
    IF NOT FOUND THEN
        -- Deleted meanwhile (cleanup, forget): a caller retries.
        RAISE EXCEPTION 'idempotency key vanished, retry' USING ERRCODE = '40001';
    END IF;

    IF r.expires_at <= now() THEN
        -- An expired row behaves as absent: take it over.
        UPDATE peer.keys k
           SET action = p_action, request_sha256 = p_fingerprint, state = 'in_progress',
               response_status = NULL, response_headers = NULL, response_body = NULL, resource_id = NULL,
               one_time_secret = false, fence = k.fence + 1, lease_until = NULL,
               created_at = now(), expires_at = now() + v_ttl
         WHERE k.principal = p_principal AND k.key = p_key AND k.expires_at <= now()
        RETURNING k.fence INTO o.fence;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'idempotency key changed meanwhile, retry' USING ERRCODE = '40001';
        END IF;
        o.outcome := 'started';
        o.created_at := now();
        o.expires_at := now() + v_ttl;
        RETURN o;
    END IF;

    o.created_at := r.created_at;
    o.expires_at := r.expires_at;
    o.fence := r.fence;
    o.resource_id := r.resource_id;
    IF r.request_sha256 <> p_fingerprint THEN
        o.outcome := 'mismatch';
    ELSIF r.state = 'completed' AND r.one_time_secret THEN
        o.outcome := 'secret_replay';
        o.response_status := r.response_status;
    ELSIF r.state = 'completed' THEN
        o.outcome := 'replay';
        o.response_status := r.response_status;
        o.response_headers := r.response_headers;
        o.response_body := r.response_body;
    ELSE
        o.outcome := 'in_progress';
        o.lease_until := r.lease_until;
    END IF;
    RETURN o;
END;
$$;

CREATE FUNCTION peer.complete(p_principal text, p_key text, p_status integer, p_body bytea DEFAULT NULL,
                              p_headers jsonb DEFAULT NULL, p_resource_id text DEFAULT NULL,
                              p_one_time_secret boolean DEFAULT false)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF p_status IS NULL OR p_status NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION 'HTTP status must be between 100 and 599' USING ERRCODE = '22023';
    END IF;
    IF p_headers IS NOT NULL AND jsonb_typeof(p_headers) <> 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object' USING ERRCODE = '22023';
    END IF;
    UPDATE peer.keys k
       SET state = 'completed', response_status = p_status,
           response_headers = CASE WHEN coalesce(p_one_time_secret, false) THEN NULL ELSE p_headers END,
           response_body = CASE WHEN coalesce(p_one_time_secret, false) THEN NULL ELSE p_body END,
           resource_id = p_resource_id, one_time_secret = coalesce(p_one_time_secret, false)
     WHERE k.principal = p_principal AND k.key = p_key AND k.state = 'in_progress';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key was not started' USING ERRCODE = '55000';
    END IF;
    RETURN true;
END;
$$;
