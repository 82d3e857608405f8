-- Argument checks, with the SQLSTATEs of the C++ edition (arguments.cpp):
-- 22004 for a NULL, 22P02 for the client's own key only, 22023 for the rest.

CREATE FUNCTION idempotency.check_request(principal text, key text, action text,
                                          fingerprint bytea, max_key_length integer,
                                          key_format text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF principal IS NULL OR key IS NULL OR action IS NULL OR fingerprint IS NULL THEN
        RAISE EXCEPTION 'principal, key, action and fingerprint must not be null'
            USING ERRCODE = '22004';
    END IF;
    -- check_principal and check_key, inline (this runs on every request).
    IF octet_length(principal) = 0 OR octet_length(principal) > 1024 THEN
        PERFORM idempotency.check_principal(principal);
    END IF;
    IF octet_length(key) = 0 OR octet_length(key) > max_key_length OR key_format <> 'any'
       OR key ~ '[\x01-\x1f\x7f\u0080-\u009f]' THEN
        PERFORM idempotency.check_key(key, max_key_length, key_format);
    END IF;
    IF octet_length(action) = 0 THEN
        RAISE EXCEPTION 'action must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(action) > 1024 THEN
        RAISE EXCEPTION 'action must be at most 1024 bytes long' USING ERRCODE = '22023';
    END IF;
    IF octet_length(fingerprint) <> 32 THEN
        RAISE EXCEPTION 'fingerprint must be 32 bytes (SHA-256)' USING ERRCODE = '22023',
            HINT = 'Compute it with idempotency.fingerprint().';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_request(text, text, text, bytea, integer, text) IS
    'Trusted edition: the checks of a request''s principal, key, action and fingerprint';

CREATE FUNCTION idempotency.check_principal(principal text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF principal IS NULL THEN
        RAISE EXCEPTION 'principal must not be null' USING ERRCODE = '22004';
    END IF;
    IF octet_length(principal) = 0 THEN
        RAISE EXCEPTION 'principal must not be empty' USING ERRCODE = '22023',
            HINT = 'Pass the authenticated user, API key or tenant; a constant such as '
                   '''default'' for a single-tenant application.';
    END IF;
    IF octet_length(principal) > 1024 THEN
        RAISE EXCEPTION 'principal must be at most 1024 bytes long' USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_principal(text) IS
    'Trusted edition: 22023 for an empty principal or one over 1024 bytes';

CREATE FUNCTION idempotency.check_key(key text, max_key_length integer, key_format text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    length integer := octet_length(key);
BEGIN
    IF length = 0 THEN
        RAISE EXCEPTION 'idempotency key must not be empty' USING ERRCODE = '22P02';
    END IF;
    IF length > max_key_length THEN
        RAISE EXCEPTION 'idempotency key is % bytes long, longer than '
                        'idempotency.max_key_length (%)', length, max_key_length
            USING ERRCODE = '22P02';
    END IF;
    -- C0 controls, DEL and the C1 controls U+0080..U+009F.
    IF key ~ '[\x01-\x1f\x7f\u0080-\u009f]' THEN
        RAISE EXCEPTION 'idempotency key must not contain control characters'
            USING ERRCODE = '22P02';
    END IF;
    IF key_format = 'any' THEN
        RETURN;
    END IF;
    IF key !~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$' THEN
        RAISE EXCEPTION 'idempotency key is not a UUID' USING ERRCODE = '22P02',
            HINT = 'idempotency.key_format requires the form 8-4-4-4-12 hexadecimal digits.';
    END IF;
    IF key ~ '[A-F]' THEN
        RAISE EXCEPTION 'idempotency key is not a lower-case UUID' USING ERRCODE = '22P02',
            HINT = 'idempotency.key_format requires lower-case hexadecimal digits, as '
                   'RFC 9562 writes them.';
    END IF;
    IF key_format = 'uuidv7' AND (substr(key, 15, 1) <> '7' OR substr(key, 20, 1) NOT IN
                                  ('8', '9', 'a', 'b')) THEN
        RAISE EXCEPTION 'idempotency key is not a version 7 UUID' USING ERRCODE = '22P02',
            HINT = 'idempotency.key_format is uuidv7.';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_key(text, integer, text) IS
    'Trusted edition: 22P02 for a malformed idempotency key';

-- A duration's microseconds as the C++ edition counts them (a month is 30 days).
CREATE FUNCTION idempotency.interval_usecs(span interval)
RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
RETURN extract(epoch FROM span) * 1000000;
COMMENT ON FUNCTION idempotency.interval_usecs(interval) IS
    'Trusted edition: microseconds of an interval, a month counted as 30 days';

-- ttl: now() + ttl after now() and at most now() + 366 days, on the timestamps
-- (so '12 mon 6 days' is refused); fields beyond 10,000 years refused first.
CREATE FUNCTION idempotency.check_ttl(ttl interval, fallback interval)
RETURNS interval
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF ttl IS NULL THEN
        RETURN fallback;
    END IF;
    IF abs(extract(year FROM ttl) * 12 + extract(month FROM ttl)) > 120000
       OR abs(extract(day FROM ttl)) > 3660000
       OR abs(extract(epoch FROM ttl - date_trunc('day', ttl))) > 3660000::numeric * 86400
       OR now() + ttl <= now() OR now() + ttl > now() + interval '366 days' THEN
        RAISE EXCEPTION 'ttl must be more than 0 and at most 366 days' USING ERRCODE = '22023';
    END IF;
    RETURN ttl;
END
$$;
COMMENT ON FUNCTION idempotency.check_ttl(interval, interval) IS
    'Trusted edition: the ttl argument or the default; 22023 outside (0, 366 days]';

CREATE FUNCTION idempotency.check_lease(lease interval, fallback interval)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lease IS NULL THEN
        RETURN fallback;
    END IF;
    IF idempotency.interval_usecs(lease) < 100000
       OR idempotency.interval_usecs(lease) > 86400000000 THEN
        RAISE EXCEPTION 'lease must be between 100 ms and 24 h' USING ERRCODE = '22023';
    END IF;
    RETURN lease;
END
$$;
COMMENT ON FUNCTION idempotency.check_lease(interval, interval) IS
    'Trusted edition: the lease argument or the default; 22023 outside [100 ms, 24 h]';

-- wait in milliseconds (the setting's default when NULL); 22023 when negative.
CREATE FUNCTION idempotency.check_wait(wait interval, fallback_ms bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF wait IS NULL THEN
        RETURN fallback_ms;
    END IF;
    IF idempotency.interval_usecs(wait) < 0 THEN
        RAISE EXCEPTION 'wait must not be negative' USING ERRCODE = '22023';
    END IF;
    RETURN least(ceil(idempotency.interval_usecs(wait) / 1000), 2147483647)::bigint;
END
$$;
COMMENT ON FUNCTION idempotency.check_wait(interval, bigint) IS
    'Trusted edition: the wait argument in milliseconds; 22023 when negative';

CREATE FUNCTION idempotency.check_status(status integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF status IS NULL THEN
        RAISE EXCEPTION 'status must not be null' USING ERRCODE = '22004';
    END IF;
    IF status < 100 OR status > 599 THEN
        RAISE EXCEPTION 'HTTP status must be between 100 and 599' USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_status(integer) IS
    'Trusted edition: 22023 for a status outside 100-599';

-- Headers: an object of name to value or an array of [name, value] pairs;
-- names RFC 9110 tokens (or :chunks, :not_kept), values RFC 9110 field values
-- (visible ASCII, SP, HTAB, U+0080..U+00FF).
CREATE FUNCTION idempotency.check_headers(headers jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind text := jsonb_typeof(headers);
    bad_name text;
    bad_value boolean;
BEGIN
    IF headers IS NULL THEN
        RETURN;
    END IF;
    -- An object whose every name and value is fine (the usual case): one query.
    IF kind = 'object' AND NOT EXISTS (
           SELECT FROM jsonb_each(headers) AS o
            WHERE jsonb_typeof(o.value) <> 'string'
               OR (o.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$'
                   AND o.key NOT IN (':chunks', ':not_kept'))
               OR (o.value #>> '{}') ~ '[^\t\x20-\x7e\u0080-\u00ff]') THEN
        RETURN;
    END IF;
    IF kind NOT IN ('object', 'array') THEN
        RAISE EXCEPTION 'headers must be a JSON object of name to value or an array of '
                        '[name, value] pairs' USING ERRCODE = '22023';
    END IF;
    IF kind = 'array' AND EXISTS (
           SELECT FROM jsonb_array_elements(headers) AS e(pair)
            WHERE jsonb_typeof(e.pair) <> 'array' OR jsonb_array_length(e.pair) <> 2) THEN
        RAISE EXCEPTION 'each header must be a [name, value] pair' USING ERRCODE = '22023';
    END IF;
    WITH entries AS (
        SELECT to_jsonb(o.name) AS name, o.value FROM jsonb_each(headers) AS o(name, value)
         WHERE kind = 'object'
        UNION ALL
        SELECT e.pair -> 0, e.pair -> 1 FROM jsonb_array_elements(headers) AS e(pair)
         WHERE kind = 'array')
    SELECT bool_or(jsonb_typeof(entries.name) <> 'string'
                   OR ((entries.name #>> '{}') !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$'
                       AND (entries.name #>> '{}') NOT IN (':chunks', ':not_kept'))),
           bool_or(jsonb_typeof(entries.value) <> 'string'
                   OR (entries.value #>> '{}') ~ '[^\t\x20-\x7e\u0080-\u00ff]')
      INTO bad_name, bad_value
      FROM entries;
    IF bad_name THEN
        RAISE EXCEPTION 'header names must be RFC 9110 tokens' USING ERRCODE = '22023';
    END IF;
    IF bad_value THEN
        RAISE EXCEPTION 'header values must be RFC 9110 field values' USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.check_headers(jsonb) IS
    'Trusted edition: 22023 for headers that are not RFC 9110 names and field values';

-- Statuses stored and replayed, per idempotency.final_statuses.
CREATE FUNCTION idempotency.is_final(status integer)
RETURNS boolean
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    list text := nullif(current_setting('idempotency.final_statuses', true), '');
    item text;
    found boolean := false;
BEGIN
    IF list IS NULL THEN
        RETURN status / 100 = 2 OR status IN (400, 403, 404, 409, 410, 412, 413, 415, 422);
    END IF;
    FOREACH item IN ARRAY string_to_array(lower(replace(list, ' ', '')), ',') LOOP
        IF item ~ '^[1-5]xx$' THEN
            found := found OR status / 100 = substr(item, 1, 1)::integer;
        ELSIF item ~ '^[0-9]{3}$' AND item::integer BETWEEN 100 AND 599 THEN
            found := found OR status = item::integer;
        ELSE
            PERFORM idempotency.setting_bad('idempotency.final_statuses', list,
                                            'codes 100-599 and classes 1xx-5xx');
        END IF;
    END LOOP;
    RETURN found;
END
$$;
COMMENT ON FUNCTION idempotency.is_final(integer) IS
    'Whether a response with this status is stored and replayed, per '
    'idempotency.final_statuses';

-- The trusted edition cannot bind principals (any role may set the
-- placeholder): with the binding off it returns the principal, otherwise the
-- settings refuse (0A000).
CREATE FUNCTION idempotency.bound_principal(principal text)
RETURNS text
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.protocol_settings();
    RETURN principal;
END
$$;
COMMENT ON FUNCTION idempotency.bound_principal(text) IS
    'Returns principal when the calling role may act for it under '
    'idempotency.principal_binding (trusted edition: off only; 0A000 otherwise)';
