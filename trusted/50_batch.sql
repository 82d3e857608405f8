-- Batches: the one-key steps for every key, the locks taken in the order of
-- the keys' bytes, one wait for the whole call, every argument checked first.

CREATE FUNCTION idempotency.check_batch_keys(principal text, keys text[],
                                             max_key_length integer, key_format text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    key text;
BEGIN
    IF principal IS NULL OR keys IS NULL THEN
        RAISE EXCEPTION 'principal and keys must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM idempotency.check_principal(principal);
    IF array_ndims(keys) > 1 THEN
        RAISE EXCEPTION 'keys must be a one-dimensional array' USING ERRCODE = '22023';
    END IF;
    IF cardinality(keys) > 1000 THEN
        RAISE EXCEPTION 'at most 1000 keys per call' USING ERRCODE = '54000';
    END IF;
    FOREACH key IN ARRAY keys LOOP
        IF key IS NULL THEN
            RAISE EXCEPTION 'keys must not hold NULL' USING ERRCODE = '22023';
        END IF;
        PERFORM idempotency.check_key(key, max_key_length, key_format);
    END LOOP;
    IF (SELECT count(DISTINCT k) FROM unnest(keys) AS u(k)) <> cardinality(keys) THEN
        RAISE EXCEPTION 'a key is given twice' USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_batch_keys(text, text[], integer, text) IS
    'Trusted edition: the checks of a batch''s keys (22004, 22023, 22P02, 54000)';

CREATE FUNCTION idempotency.check_same_length(keys text[], other anyarray, name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF other IS NOT NULL AND (array_ndims(other) > 1
                              OR coalesce(cardinality(other), 0) <> cardinality(keys)) THEN
        RAISE EXCEPTION '% must have one element per key', name USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_same_length(text[], anyarray, text) IS
    'Trusted edition: 22023 unless an array has one element per key';

CREATE FUNCTION idempotency.begin_batch(principal text, keys text[], action text,
                                        fingerprints bytea[], ttl interval DEFAULT NULL,
                                        wait interval DEFAULT NULL)
RETURNS SETOF idempotency.batch_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
    span interval;
    wait_ms bigint;
    deadline timestamptz;
    i integer;
    a idempotency.key_outcome;
    answers idempotency.batch_outcome[];
BEGIN
    IF action IS NULL OR fingerprints IS NULL THEN
        RAISE EXCEPTION 'principal, keys, action and fingerprints must not be null'
            USING ERRCODE = '22004';
    END IF;
    PERFORM idempotency.check_batch_keys(principal, keys, s.max_key_length, s.key_format);
    PERFORM idempotency.check_same_length(keys, fingerprints, 'fingerprints');
    FOR i IN 1 .. coalesce(cardinality(keys), 0) LOOP
        IF fingerprints[i] IS NULL THEN
            RAISE EXCEPTION 'fingerprints must not hold NULL' USING ERRCODE = '22023';
        END IF;
        PERFORM idempotency.check_request(principal, keys[i], action, fingerprints[i],
                                          s.max_key_length, s.key_format);
    END LOOP;
    span := idempotency.check_ttl(ttl, s.key_ttl);
    wait_ms := idempotency.check_wait(wait, s.wait_ms);
    PERFORM idempotency.refuse_read_only();
    deadline := clock_timestamp() + make_interval(secs => wait_ms / 1000.0);
    answers := array_fill(NULL::idempotency.batch_outcome, ARRAY[cardinality(keys)]);
    FOR i IN SELECT u.ord FROM unnest(keys) WITH ORDINALITY AS u(key, ord)
              ORDER BY convert_to(u.key, 'UTF8') LOOP
        a := idempotency.begin_key(principal, keys[i], action, fingerprints[i], span,
                                   greatest(0, (extract(epoch FROM deadline - clock_timestamp())
                                                * 1000)::bigint));
        answers[i] := ROW(i, keys[i], a.outcome, a.response_status, a.response_headers,
                          a.response_body, a.resource_id, a.created_at, a.expires_at, a.fence,
                          a.lease_until);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(answers);
END
$$;
COMMENT ON FUNCTION idempotency.begin_batch(text, text[], text, bytea[], interval, interval) IS
    'idempotency.begin for each key (fingerprints[i] is the request of keys[i]): one row per '
    'key in input order';

CREATE FUNCTION idempotency.complete_batch(principal text, keys text[], statuses integer[],
                                           bodies bytea[] DEFAULT NULL,
                                           headers jsonb[] DEFAULT NULL,
                                           resource_ids text[] DEFAULT NULL)
RETURNS TABLE (ord integer, key text, completed boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
    i integer;
BEGIN
    IF statuses IS NULL THEN
        RAISE EXCEPTION 'principal, keys and statuses must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM idempotency.check_batch_keys(principal, keys, s.max_key_length, s.key_format);
    PERFORM idempotency.check_same_length(keys, statuses, 'statuses');
    PERFORM idempotency.check_same_length(keys, bodies, 'bodies');
    PERFORM idempotency.check_same_length(keys, headers, 'headers');
    PERFORM idempotency.check_same_length(keys, resource_ids, 'resource_ids');
    FOR i IN 1 .. coalesce(cardinality(keys), 0) LOOP
        IF statuses[i] IS NULL THEN
            RAISE EXCEPTION 'statuses must not hold NULL' USING ERRCODE = '22023';
        END IF;
        PERFORM idempotency.check_status(statuses[i]);
        IF NOT idempotency.is_final(statuses[i]) THEN
            RAISE EXCEPTION 'status % is not final', statuses[i] USING ERRCODE = '22023';
        END IF;
        PERFORM idempotency.check_headers(headers[i]);
    END LOOP;
    PERFORM idempotency.refuse_read_only();
    FOR i IN SELECT u.ord FROM unnest(keys) WITH ORDINALITY AS u(key, ord)
              ORDER BY convert_to(u.key, 'UTF8') LOOP
        PERFORM idempotency.complete_key(principal, keys[i], statuses[i], bodies[i], headers[i],
                                         resource_ids[i], false);
    END LOOP;
    RETURN QUERY SELECT u.ord::integer, u.key, true
                   FROM unnest(keys) WITH ORDINALITY AS u(key, ord) ORDER BY u.ord;
END
$$;
COMMENT ON FUNCTION idempotency.complete_batch(text, text[], integer[], bytea[], jsonb[],
                                               text[]) IS
    'idempotency.complete for each key begun in this transaction: the i-th status, body, '
    'headers and resource id are those of keys[i]';

CREATE FUNCTION idempotency.claim_batch(principal text, keys text[], ttl interval DEFAULT NULL)
RETURNS TABLE (ord integer, key text, claimed boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
    span interval;
    deadline timestamptz;
    i integer;
    answers boolean[];
BEGIN
    PERFORM idempotency.check_batch_keys(principal, keys, s.max_key_length, s.key_format);
    span := idempotency.check_ttl(ttl, s.key_ttl);
    PERFORM idempotency.refuse_read_only();
    deadline := clock_timestamp() + make_interval(secs => s.wait_ms / 1000.0);
    answers := array_fill(NULL::boolean, ARRAY[cardinality(keys)]);
    FOR i IN SELECT u.ord FROM unnest(keys) WITH ORDINALITY AS u(key, ord)
              ORDER BY convert_to(u.key, 'UTF8') LOOP
        answers[i] := idempotency.claim_key(
            principal, keys[i], span,
            greatest(0, (extract(epoch FROM deadline - clock_timestamp()) * 1000)::bigint));
    END LOOP;
    RETURN QUERY SELECT u.ord::integer, u.key, answers[u.ord]
                   FROM unnest(keys) WITH ORDINALITY AS u(key, ord) ORDER BY u.ord;
END
$$;
COMMENT ON FUNCTION idempotency.claim_batch(text, text[], interval) IS
    'idempotency.claim for each key: true for the keys this call claimed';
