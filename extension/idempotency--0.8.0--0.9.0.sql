-- pg_idempotency 0.8.0 -> 0.9.0: the findings from outside on 0.8.0 (issue 33).
-- The library's own fixes (a fenced completion of a dead row is refused; upper-case
-- UUID keys and header values outside RFC 9110 are refused) need nothing here;
-- set_expiry_policy checks its arguments as the calls it governs do; and the
-- HTTP answer of an outcome, http_answer (issue 35), shared with the trusted edition.
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

-- cleanup_batch_tombstones as in 0.8.0, but for one condition: its DELETE
-- removes only the row version the batch chose. A request that took over a
-- dead row (a tombstone past its end) while the DELETE waited for its lock
-- wrote a new row there; when that row had already expired (a ttl shorter than
-- the request), 0.8.0 deleted it instead of keeping it as a tombstone, and a
-- retry within the grace ran again (the model checker, EXP under --refuse;
-- tests/isolation/specs/cleanup_spares_replaced_tombstone.spec).
CREATE OR REPLACE FUNCTION idempotency.cleanup_batch_tombstones(batch_size integer, after timestamptz,
                                                     OUT deleted integer, OUT last_expiry timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
    -- By (principal, key) in both placements: a ctid means nothing across
    -- Citus shards, and this path runs only while some action refuses.
    -- The tombstone's times are computed here, not in the UPDATE: Citus refuses
    -- a stable function (timestamptz + interval) over columns in an UPDATE.
    WITH victims AS MATERIALIZED (
        SELECT k.principal, k.key, p.grace, k.expires_at AS expired_at,
               k.expires_at OPERATOR(pg_catalog.+) p.grace AS tombstone_end
          FROM idempotency.keys AS k
          LEFT JOIN idempotency.expiry_policies AS p
            ON p.action OPERATOR(pg_catalog.=) k.action
           AND k.state OPERATOR(pg_catalog.<>) 'expired'
           AND k.expires_at OPERATOR(pg_catalog.+) p.grace OPERATOR(pg_catalog.>) pg_catalog.now()
         WHERE pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                   '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                   OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                   '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
                   OPERATOR(pg_catalog.>=)
                   pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval,
                                       COALESCE(after, '-infinity'::pg_catalog.timestamptz),
                                       '2000-01-01 00:00:00+00'::pg_catalog.timestamptz)
           AND k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND k.expires_at OPERATOR(pg_catalog.>=) COALESCE(after, '-infinity'::pg_catalog.timestamptz)
           AND (k.lease_until IS NULL OR k.lease_until OPERATOR(pg_catalog.<=) clock)
         ORDER BY pg_catalog.date_bin('00:00:00.01'::pg_catalog.interval, k.expires_at,
                                      '2000-01-01 00:00:00+00'::pg_catalog.timestamptz),
                  k.expires_at
         LIMIT GREATEST(batch_size, 0)),
    kept AS (
        UPDATE idempotency.keys AS t
           SET state = 'expired', response_status = NULL, response_headers = NULL, response_body = NULL,
               resource_id = NULL, one_time_secret = false, lease_until = v.expired_at,
               expires_at = v.tombstone_end
          FROM victims AS v
         WHERE t.principal OPERATOR(pg_catalog.=) v.principal AND t.key OPERATOR(pg_catalog.=) v.key
           AND v.grace IS NOT NULL AND t.state OPERATOR(pg_catalog.<>) 'expired'
           AND t.expires_at OPERATOR(pg_catalog.=) v.expired_at
           AND t.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND (t.lease_until IS NULL OR t.lease_until OPERATOR(pg_catalog.<=) clock)
        RETURNING t.lease_until AS expiry),
    gone AS (
        DELETE FROM idempotency.keys AS d USING victims AS v
         WHERE d.principal OPERATOR(pg_catalog.=) v.principal AND d.key OPERATOR(pg_catalog.=) v.key
           AND v.grace IS NULL
           -- The row this batch chose, not a newer one written in its place while
           -- the DELETE waited for it (a takeover of a dead row, which the next
           -- batch judges afresh: a refusing action's key becomes a tombstone).
           AND d.expires_at OPERATOR(pg_catalog.=) v.expired_at
           AND d.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           AND (d.lease_until IS NULL OR d.lease_until OPERATOR(pg_catalog.<=) clock)
        RETURNING d.action, d.expires_at AS expiry),
    per_action AS (
        SELECT gone.action, pg_catalog.count(*) AS n FROM gone GROUP BY gone.action),
    counted AS (
        SELECT COALESCE(pg_catalog.sum(p.n), 0) AS n FROM per_action AS p
         WHERE idempotency.count_cleanup(p.action, p.n))
    SELECT ((SELECT c.n FROM counted AS c) OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM kept))::pg_catalog.int4,
           GREATEST((SELECT pg_catalog.max(g.expiry) FROM gone AS g), (SELECT pg_catalog.max(t.expiry) FROM kept AS t))
      INTO deleted, last_expiry;
END
$$;

-- >>> shared with the trusted edition: tools/trusted.sh copies this block as it is
-- The HTTP answer of an outcome that does not run the handler (issue 35): one
-- table of the contract in the extension, which every client can take instead
-- of its own copy. The bytes are those 0.8.0's C++ client built itself: problem bodies
-- are RFC 9457 objects with their members in byte order (detail, status, title,
-- type) and no spaces; headers are [name, value] pairs in the order a client
-- sends them. client/protocol.json is the table this follows.
CREATE FUNCTION idempotency.http_answer(result idempotency.key_outcome,
                                        type_base text DEFAULT '/problems/',
                                        retry_after integer DEFAULT 1,
                                        OUT status integer, OUT headers jsonb, OUT body bytea)
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind text;  -- the problem of client/protocol.json
    title text;
    detail text;
    slug text;
    replayed boolean := false;
    stored jsonb := result.response_headers;
    expires jsonb := '[]';
    seconds integer;
BEGIN
    IF result.outcome IS NULL THEN
        RAISE EXCEPTION 'the outcome must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF type_base IS NULL OR retry_after IS NULL THEN
        RAISE EXCEPTION 'type_base and retry_after must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF result.outcome = 'started' THEN
        RETURN;  -- the handler runs: no answer yet (status, headers and body NULL)
    END IF;
    -- Every answer tells the key's expiry (an IMF-fixdate, RFC 9110), never stored.
    IF result.expires_at IS NOT NULL THEN
        expires := jsonb_build_array(jsonb_build_array('Idempotency-Expires',
            to_char(result.expires_at AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "GMT"')));
    END IF;
    CASE result.outcome
    WHEN 'replay' THEN
        IF jsonb_typeof(stored) = 'array' THEN
            -- Pairs of two strings, in their order (repeated names kept).
            SELECT coalesce(jsonb_agg(p ORDER BY n), '[]') INTO headers
              FROM jsonb_array_elements(stored) WITH ORDINALITY AS e(p, n)
             WHERE jsonb_typeof(p) = 'array' AND jsonb_array_length(p) = 2
               AND jsonb_typeof(p -> 0) = 'string' AND jsonb_typeof(p -> 1) = 'string';
        ELSIF jsonb_typeof(stored) = 'object' THEN
            -- The object form of 0.1.0-0.5.0: names in byte order.
            SELECT coalesce(jsonb_agg(jsonb_build_array(k, v) ORDER BY k COLLATE "C"), '[]')
                   INTO headers
              FROM jsonb_each(stored) AS e(k, v)
             WHERE jsonb_typeof(v) = 'string';
        ELSE
            headers := '[]';
        END IF;
        IF EXISTS (SELECT FROM jsonb_array_elements(headers) AS e(p)
                    WHERE lower((p ->> 0) COLLATE "C") = ':not_kept') THEN
            kind := 'response_not_kept';
            replayed := true;
        ELSE
            -- The marker and the expiry are the answer's own: set once, at the end.
            SELECT coalesce(jsonb_agg(p ORDER BY n), '[]') INTO headers
              FROM jsonb_array_elements(headers) WITH ORDINALITY AS e(p, n)
             WHERE lower((p ->> 0) COLLATE "C") NOT IN ('idempotent-replay', 'idempotency-expires');
            status := result.response_status;
            headers := headers || '[["Idempotent-Replay", "true"]]' || expires;
            body := coalesce(result.response_body, '\x'::bytea);
            RETURN;
        END IF;
    WHEN 'secret_replay' THEN
        kind := 'one_time_secret';
        replayed := true;
    WHEN 'mismatch' THEN
        kind := 'key_reuse';
    WHEN 'in_progress' THEN
        kind := 'request_in_progress';
    WHEN 'expired' THEN
        kind := 'key_expired';
    ELSE
        RAISE EXCEPTION 'unknown outcome "%"', result.outcome USING ERRCODE = '22023';
    END CASE;
    SELECT t.status, t.slug, t.title, t.detail INTO status, slug, title, detail
      FROM (VALUES
        ('key_reuse', 422, 'idempotency-key-reuse', 'Idempotency-Key was used for another request',
         'This Idempotency-Key was used for a different request; use a new key for a new request.'),
        ('request_in_progress', 409, 'request-in-progress',
         'A request with this Idempotency-Key is in progress',
         'A request with this Idempotency-Key is still being processed; retry later.'),
        ('one_time_secret', 409, 'one-time-secret',
         'The response to this request was sent once and not kept',
         'The first response to this request carried a secret and was not kept; create a new one '
         'with a new key.'),
        ('response_not_kept', 409, 'response-not-kept',
         'The response to this request was too large to keep',
         'The first response to this request was streamed and was larger than this service '
         'keeps; it was sent once and not stored. Use a new key for a new request.'),
        ('key_expired', 410, 'idempotency-key-expired', 'Idempotency-Key has expired',
         'This Idempotency-Key expired and its response is no longer kept; the request was not '
         'run again. Use a new key for a new request.')
      ) AS t(problem, status, slug, title, detail)
     WHERE t.problem = kind;
    body := convert_to('{"detail":' || to_json(detail)::text || ',"status":' || status::text
                       || ',"title":' || to_json(title)::text || ',"type":'
                       || to_json(type_base || slug)::text || '}', 'UTF8');
    headers := '[["Content-Type", "application/problem+json"]]';
    IF replayed THEN
        headers := headers || '[["Idempotent-Replay", "true"]]';
    END IF;
    IF kind = 'request_in_progress' THEN
        -- Under a lease: when it runs out; else the caller's retry_after (at least 1).
        seconds := greatest(1, retry_after);
        IF result.lease_until IS NOT NULL THEN
            seconds := greatest(1, ceil(extract(epoch FROM result.lease_until - clock_timestamp()))::integer);
        END IF;
        headers := headers || jsonb_build_array(jsonb_build_array('Retry-After', seconds::text));
    END IF;
    headers := headers || expires;
END
$$;
COMMENT ON FUNCTION idempotency.http_answer(idempotency.key_outcome, text, integer) IS
    'The HTTP answer of an outcome that does not run the handler: replay (the stored status, kept headers and body, Idempotent-Replay, Idempotency-Expires), mismatch 422, in_progress 409 with Retry-After, secret_replay and a response not kept 409, expired 410, as RFC 9457 problems under type_base; started: all NULL (run the handler). Headers are [name, value] pairs in order; a name starting with ":" (":chunks") is the client''s instruction, not a header';

CREATE FUNCTION idempotency.http_answer(result idempotency.batch_outcome,
                                        type_base text DEFAULT '/problems/',
                                        retry_after integer DEFAULT 1,
                                        OUT status integer, OUT headers jsonb, OUT body bytea)
    LANGUAGE sql VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    RETURN idempotency.http_answer(ROW(result.outcome, result.response_status,
                                       result.response_headers, result.response_body,
                                       result.resource_id, result.created_at, result.expires_at,
                                       result.fence, result.lease_until)::idempotency.key_outcome,
                                   type_base, retry_after);
COMMENT ON FUNCTION idempotency.http_answer(idempotency.batch_outcome, text, integer) IS
    'idempotency.http_answer of one row of begin_batch';
-- What a handler's status means for storage, the one table every middleware
-- follows: a final 2xx commits with the key; a final error (4xx) rolls the
-- handler's writes back and is saved alone (save_final); anything not final
-- (401, 428, 429, 3xx, 5xx by default: idempotency.final_statuses) rolls back
-- and stores nothing, so a retry runs.
CREATE FUNCTION idempotency.http_storage(status integer)
    RETURNS text
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF status IS NULL OR status < 100 OR status > 599 THEN
        RAISE EXCEPTION 'an HTTP status is 100 to 599, not %', coalesce(status::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF NOT idempotency.is_final(status) THEN
        RETURN 'not_stored';
    END IF;
    RETURN CASE WHEN status >= 400 THEN 'saved_after_rollback' ELSE 'committed_with_key' END;
END
$$;
COMMENT ON FUNCTION idempotency.http_storage(integer) IS
    'What a handler''s response with this status does: committed_with_key (final, below 400), saved_after_rollback (final error: roll back, then save_final), not_stored (not final per idempotency.final_statuses: roll back, a retry runs); 22023 outside 100-599';
-- <<< shared with the trusted edition
