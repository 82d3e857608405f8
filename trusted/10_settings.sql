-- Settings. Without the library nobody registers the idempotency.* settings:
-- a value set for one (SET, ALTER ROLE/DATABASE ... SET, postgresql.conf) is a
-- placeholder PostgreSQL keeps as text. They are read here with
-- current_setting(name, true) and checked at every use against the ranges of
-- the C++ edition: a value out of range or not understood refuses the call
-- with 22023 naming the setting, instead of running with a value nobody chose.

DO $$
BEGIN
    -- date_bin (the expiry index) and hashtextextended need PostgreSQL 14.
    IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4
           OPERATOR(pg_catalog.<) 140000 THEN
        RAISE EXCEPTION 'the trusted edition of idempotency needs PostgreSQL 14 or later'
            USING ERRCODE = '0A000';
    END IF;
END
$$;

CREATE FUNCTION idempotency.setting_bad(name text, value text, range text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, value
        USING ERRCODE = '22023',
              HINT = format('The trusted edition reads %s at every call; allowed: %s.',
                            name, range);
END
$$;
COMMENT ON FUNCTION idempotency.setting_bad(text, text, text) IS
    'Trusted edition: raises 22023 for a setting whose value is out of range';

-- An integer setting, with an optional unit (the GUC units of the C++
-- edition: ms, s, min, h, d), in the setting's base unit.
CREATE FUNCTION idempotency.setting_int(name text, fallback bigint, low bigint, high bigint,
                                        base_unit text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting(name, true);
    parts text[];
    value numeric;
    factor numeric := 1;
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN fallback;
    END IF;
    parts := regexp_match(raw, '^\s*([0-9]+)\s*(ms|s|min|h|d)?\s*$');
    IF parts IS NULL OR (parts[2] IS NOT NULL AND base_unit IS NULL) THEN
        PERFORM idempotency.setting_bad(name, raw, format('%s to %s', low, high));
    END IF;
    IF parts[2] IS NOT NULL THEN
        factor := CASE parts[2] WHEN 'ms' THEN 1 WHEN 's' THEN 1000 WHEN 'min' THEN 60000
                                WHEN 'h' THEN 3600000 ELSE 86400000 END
                  / CASE base_unit WHEN 'ms' THEN 1 ELSE 1000 END;
    END IF;
    value := parts[1]::numeric * factor;
    IF value <> trunc(value) OR value < low OR value > high THEN
        PERFORM idempotency.setting_bad(name, raw, format('%s to %s', low, high));
    END IF;
    RETURN value::bigint;
END
$$;
COMMENT ON FUNCTION idempotency.setting_int(text, bigint, bigint, bigint, text) IS
    'Trusted edition: an integer idempotency.* setting in its base unit, checked (22023)';

-- The settings every protocol call reads, in one call: key_ttl (s),
-- wait_timeout (ms), lease (ms), max_key_length, key_format. The principal
-- binding cannot be enforced without the library (any role may SET the
-- placeholder), so a binding in force anywhere - this session, ALTER ROLE or
-- ALTER DATABASE - refuses every call (0A000) instead of running unbound.
CREATE FUNCTION idempotency.protocol_settings(
    OUT key_ttl interval, OUT wait_ms bigint, OUT lease interval, OUT max_key_length integer,
    OUT key_format text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    binding text := current_setting('idempotency.principal_binding', true);
    distributed text := current_setting('idempotency.distributed', true);
BEGIN
    -- A role may SET the placeholder off in its session; what ALTER DATABASE
    -- (the owner) or ALTER ROLE set for it still refuses.
    IF (binding IS NOT NULL AND binding NOT IN ('', 'off'))
       OR EXISTS (SELECT FROM pg_db_role_setting AS d
                   WHERE d.setdatabase IN (0, (SELECT oid FROM pg_database
                                                WHERE datname = current_database()))
                     AND d.setrole IN (0, (SELECT oid FROM pg_roles
                                            WHERE rolname = session_user))
                     AND EXISTS (SELECT FROM unnest(d.setconfig) AS c
                                  WHERE c LIKE 'idempotency.principal\_binding=%'
                                    AND c NOT IN ('idempotency.principal_binding=off',
                                                  'idempotency.principal_binding=')))
    THEN
        RAISE EXCEPTION 'idempotency.principal_binding is not available in the trusted edition'
            USING ERRCODE = '0A000',
                  DETAIL = 'Without the library any role may set the parameter, so a binding '
                           'could not be enforced.',
                  HINT = 'Use the C++ edition for bound principals, or RESET the parameter.';
    END IF;
    IF distributed IS NOT NULL AND distributed NOT IN ('', 'auto') THEN
        RAISE EXCEPTION 'idempotency.distributed = % is not available in the trusted edition',
                        distributed
            USING ERRCODE = '0A000';
    END IF;
    -- Unset (the usual case): the defaults, without parsing anything.
    key_ttl := CASE WHEN coalesce(current_setting('idempotency.key_ttl', true), '') = ''
                    THEN interval '1 day'
                    ELSE make_interval(secs => idempotency.setting_int(
                             'idempotency.key_ttl', 86400, 1, 366 * 86400, 's')) END;
    wait_ms := CASE WHEN coalesce(current_setting('idempotency.wait_timeout', true), '') = ''
                    THEN 5000
                    ELSE idempotency.setting_int('idempotency.wait_timeout', 5000, 0, 3600000,
                                                 'ms') END;
    lease := CASE WHEN coalesce(current_setting('idempotency.lease', true), '') = ''
                  THEN interval '30 seconds'
                  ELSE make_interval(secs => idempotency.setting_int(
                           'idempotency.lease', 30000, 100, 86400000, 'ms') / 1000.0) END;
    max_key_length := CASE WHEN coalesce(current_setting('idempotency.max_key_length', true),
                                         '') = ''
                           THEN 255
                           ELSE idempotency.setting_int('idempotency.max_key_length', 255, 1,
                                                        1024) END;
    key_format := coalesce(nullif(current_setting('idempotency.key_format', true), ''), 'any');
    IF key_format NOT IN ('any', 'uuid', 'uuidv7') THEN
        PERFORM idempotency.setting_bad('idempotency.key_format', key_format,
                                        'any, uuid, uuidv7');
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.protocol_settings() IS
    'Trusted edition: the idempotency.* settings of the protocol, checked (22023, 0A000)';

-- Every idempotency.* setting checked at once (22023 naming the first bad one).
CREATE FUNCTION idempotency.settings_in_use()
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.protocol_settings();
    PERFORM idempotency.setting_int('idempotency.cleanup_batch_size', 1000, 1, 1000000);
    PERFORM idempotency.setting_int('idempotency.max_json_depth', 1000, 1, 1000000);
    PERFORM idempotency.is_final(200);
END
$$;
COMMENT ON FUNCTION idempotency.settings_in_use() IS
    'Trusted edition: checks every idempotency.* setting as the calls read them (22023)';
