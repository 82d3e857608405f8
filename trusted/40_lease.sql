-- The lease protocol (acquire, renew, complete with a fence, release) and claim.

CREATE FUNCTION idempotency.acquire(principal text, key text, action text, fingerprint bytea,
                                    lease interval DEFAULT NULL, ttl interval DEFAULT NULL,
                                    wait interval DEFAULT NULL)
RETURNS idempotency.key_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
    span interval;
    hold interval;
    wait_ms bigint;
    r idempotency.keys;
    outcome text;
BEGIN
    PERFORM idempotency.check_request(principal, key, action, fingerprint,
                                      s.max_key_length, s.key_format);
    hold := idempotency.check_lease(lease, s.lease);
    span := idempotency.check_ttl(ttl, s.key_ttl);
    wait_ms := idempotency.check_wait(wait, s.wait_ms);
    PERFORM idempotency.refuse_read_only();
    PERFORM idempotency.refuse_begun(principal, key,
                                     'A key is held by begin or by acquire, not both.');
    IF NOT idempotency.key_lock(idempotency.key_lock_id(principal, key), wait_ms) THEN
        RETURN idempotency.answer('in_progress', NULL);
    END IF;
    r := idempotency.find_key(principal, key);
    outcome := idempotency.outcome_for(r, fingerprint);
    IF outcome <> 'started' THEN
        RETURN idempotency.answer(outcome, r);
    END IF;
    -- A lease a caller has seen must survive a crash.
    PERFORM set_config('synchronous_commit', 'on', true);
    INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state,
                                       lease_until, created_at, expires_at, fence)
    VALUES (principal, key, action, fingerprint, 'in_progress', clock_timestamp() + hold,
            now(), now() + span, idempotency.next_fence(r.fence))
    ON CONFLICT ON CONSTRAINT keys_pkey DO UPDATE
       SET action = excluded.action, request_sha256 = excluded.request_sha256,
           state = 'in_progress', response_status = NULL, response_headers = NULL,
           response_body = NULL, resource_id = NULL, one_time_secret = false,
           fence = greatest(excluded.fence, k.fence + 1), lease_until = excluded.lease_until,
           created_at = CASE WHEN k.expires_at <= now() THEN excluded.created_at
                             ELSE k.created_at END,
           expires_at = CASE WHEN k.expires_at <= now() THEN excluded.expires_at
                             ELSE k.expires_at END
     WHERE (k.expires_at <= now()
            AND (k.lease_until IS NULL OR k.lease_until <= clock_timestamp()))
        OR (k.state = 'in_progress' AND k.lease_until <= clock_timestamp()
            AND k.request_sha256 = excluded.request_sha256)
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'could not serialize access due to a concurrent use of the '
                        'idempotency key' USING ERRCODE = '40001';
    END IF;
    RETURN idempotency.answer('started', r);
END
$$;
COMMENT ON FUNCTION idempotency.acquire(text, text, text, bytea, interval, interval, interval)
    IS 'Lease protocol: claims the key with a lease and a fence (outcome started), takes over a '
       'lapsed lease of the same request, or answers as begin does';

CREATE FUNCTION idempotency.renew(principal text, key text, fence bigint,
                                  lease interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
    hold interval;
BEGIN
    IF principal IS NULL OR key IS NULL OR fence IS NULL THEN
        RAISE EXCEPTION 'principal, key and fence must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM idempotency.check_principal(principal);
    PERFORM idempotency.check_key(key, s.max_key_length, s.key_format);
    hold := idempotency.check_lease(lease, s.lease);
    PERFORM idempotency.refuse_read_only();
    UPDATE idempotency.keys AS k SET lease_until = clock_timestamp() + hold
     WHERE k.principal = renew.principal AND k.key = renew.key AND k.fence = renew.fence
       AND k.state = 'in_progress'
       AND (k.expires_at > now() OR k.lease_until > clock_timestamp());
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idempotency.renew(text, text, bigint, interval) IS
    'Lease protocol: extends the lease of the holder of fence; false when the lease was lost';

CREATE FUNCTION idempotency.complete_lease(principal text, key text, fence bigint,
                                           status integer, body bytea, headers jsonb,
                                           resource_id text, one_time_secret boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r idempotency.keys;
BEGIN
    UPDATE idempotency.keys AS k
       SET state = 'completed', response_status = status,
           response_body = CASE WHEN complete_lease.one_time_secret THEN NULL ELSE body END,
           response_headers = CASE WHEN complete_lease.one_time_secret THEN NULL
                                   ELSE headers END,
           resource_id = complete_lease.resource_id,
           one_time_secret = complete_lease.one_time_secret, lease_until = NULL
     WHERE k.principal = complete_lease.principal AND k.key = complete_lease.key
       AND k.fence = complete_lease.fence AND k.state = 'in_progress'
       AND (k.expires_at > now() OR k.lease_until > clock_timestamp())
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Completed after its ttl ran out (the lease kept it live): one more ttl.
    IF r.expires_at <= now() THEN
        UPDATE idempotency.keys AS k SET expires_at = now() + (r.expires_at - r.created_at)
         WHERE k.principal = complete_lease.principal AND k.key = complete_lease.key
           AND k.expires_at < now() + (r.expires_at - r.created_at);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION idempotency.complete_lease(text, text, bigint, integer, bytea, jsonb, text,
                                               boolean) IS
    'Trusted edition: complete with a fence (stores while the fence holds the key)';

CREATE FUNCTION idempotency.release(principal text, key text, fence bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
BEGIN
    IF principal IS NULL OR key IS NULL OR fence IS NULL THEN
        RAISE EXCEPTION 'principal, key and fence must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM idempotency.check_principal(principal);
    PERFORM idempotency.check_key(key, s.max_key_length, s.key_format);
    PERFORM idempotency.refuse_read_only();
    UPDATE idempotency.keys AS k SET lease_until = '-infinity'
     WHERE k.principal = release.principal AND k.key = release.key AND k.fence = release.fence
       AND k.state = 'in_progress' AND k.lease_until > clock_timestamp();
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idempotency.release(text, text, bigint) IS
    'Lease protocol: ends the lease of fence so that a retry may run again; false when the '
    'fence no longer holds the key or its lease had run out';

-- claim for one checked key, within the call's wait: shared with claim_batch.
CREATE FUNCTION idempotency.claim_key(principal text, key text, ttl interval, wait_ms bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r idempotency.keys;
BEGIN
    PERFORM idempotency.refuse_begun(principal, key, 'The key is held by begin.');
    IF NOT idempotency.key_lock(idempotency.key_lock_id(principal, key), wait_ms) THEN
        RETURN false;
    END IF;
    r := idempotency.find_key(principal, key);
    IF r.principal IS NOT NULL
       AND (r.expires_at > now()
            OR (r.state = 'in_progress' AND r.lease_until > clock_timestamp())
            OR idempotency.expiry_refuses(r)) THEN
        RETURN false;
    END IF;
    INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state,
                                       response_status, created_at, expires_at, fence)
    VALUES (principal, key, 'claim', decode(repeat('00', 32), 'hex'), 'completed', 204,
            now(), now() + ttl, idempotency.next_fence(r.fence))
    ON CONFLICT ON CONSTRAINT keys_pkey DO UPDATE
       SET action = excluded.action, request_sha256 = excluded.request_sha256,
           state = 'completed', response_status = 204, response_headers = NULL,
           response_body = NULL, resource_id = NULL, one_time_secret = false,
           fence = greatest(excluded.fence, k.fence + 1), lease_until = NULL,
           created_at = excluded.created_at, expires_at = excluded.expires_at
     WHERE k.expires_at <= now()
       AND (k.lease_until IS NULL OR k.lease_until <= clock_timestamp());
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idempotency.claim_key(text, text, interval, bigint) IS
    'Trusted edition: claim for one checked key (claim and claim_batch)';

CREATE FUNCTION idempotency.claim(principal text, key text, ttl interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
    span interval;
BEGIN
    IF principal IS NULL OR key IS NULL THEN
        RAISE EXCEPTION 'principal and key must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM idempotency.check_principal(principal);
    PERFORM idempotency.check_key(key, s.max_key_length, s.key_format);
    span := idempotency.check_ttl(ttl, s.key_ttl);
    PERFORM idempotency.refuse_read_only();
    RETURN idempotency.claim_key(principal, key, span, s.wait_ms);
END
$$;
COMMENT ON FUNCTION idempotency.claim(text, text, interval) IS
    'At-most-once marker: true for the first caller within ttl (default idempotency.key_ttl), '
    'false for every other';
