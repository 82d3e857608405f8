-- RFC 8785 (JCS) and the request fingerprint in SQL and PL/pgSQL, with the C++
-- edition's bytes (tests/integration/trusted_edition.sh compares them on
-- tests/jcs and the fingerprint corpus). PostgreSQL's json parser checks the
-- syntax (22P02, as the C++ edition); the walk below sorts members by UTF-16
-- code units, refuses duplicate names (22032), writes strings as
-- JSON.stringify does (to_json) and numbers as ECMAScript's Number::toString,
-- from float8out's shortest round-trip digits.

-- A number token as ECMAScript writes the nearest double.
CREATE FUNCTION idempotency.jcs_number(token text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 1
AS $$
DECLARE
    parts text[];
    digits text;
    point integer;
    lead integer;
    scale integer;
    value float8;
    shortest text;
    negative boolean;
    k integer;
    n integer;
    rounded numeric;
BEGIN
    -- The decimal exponent of the literal decides the cases float8in refuses:
    -- beyond the largest double (22032) and below half the smallest (0).
    parts := regexp_match(token, '^(-?)([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?$');
    digits := parts[2] || coalesce(parts[3], '');
    lead := length(digits) - length(ltrim(digits, '0'));
    IF lead = length(digits) THEN
        RETURN '0';
    END IF;
    IF length(coalesce(parts[4], '')) > 9 THEN
        scale := CASE WHEN parts[4] LIKE '-%' THEN -1000000000 ELSE 1000000000 END;
    ELSE
        scale := coalesce(parts[4], '0')::integer + length(parts[2]) - lead - 1;
    END IF;
    IF scale > 308 THEN
        -- 1.8e308 and up overflow; 1.7976931348623157e308 does not: float8in decides.
        IF scale > 309 THEN
            RAISE EXCEPTION 'number out of the range of a double' USING ERRCODE = '22032';
        END IF;
    ELSIF scale < -325 THEN
        RETURN '0';
    END IF;
    IF scale BETWEEN -300 AND 300 THEN
        value := token::float8;
    ELSE
        -- Only near the ends of the range: a subtransaction per such number.
        BEGIN
            value := token::float8;
        EXCEPTION WHEN numeric_value_out_of_range THEN
            IF scale > 0 THEN
                RAISE EXCEPTION 'number out of the range of a double' USING ERRCODE = '22032';
            END IF;
            RETURN '0';
        END;
    END IF;
    IF value = 0 THEN
        RETURN '0';
    END IF;
    shortest := value::text;
    negative := shortest LIKE '-%';
    parts := regexp_match(ltrim(shortest, '-'), '^([0-9]+)(?:\.([0-9]+))?(?:e([-+][0-9]+))?$');
    digits := parts[1] || coalesce(parts[2], '');
    point := length(parts[1]) + coalesce(parts[3], '0')::integer;
    lead := length(digits) - length(ltrim(digits, '0'));
    digits := rtrim(ltrim(digits, '0'), '0');
    n := point - lead;
    k := length(digits);
    -- float8out (Ryu) leaves out a shorter decimal that lies exactly halfway
    -- between two doubles and reads back as this one (1e23 comes out as
    -- 9.999999999999999e+22); ECMAScript takes it. Only long outputs can hide one.
    IF k >= 16 AND n BETWEEN -300 AND 300 THEN
        FOR j IN 1 .. k - 1 LOOP
            rounded := round(('0.' || digits)::numeric, j);
            IF (rounded::text || 'e' || n)::float8 = abs(value) THEN
                IF rounded >= 1 THEN
                    digits := '1';
                    n := n + 1;
                ELSE
                    digits := rtrim(substr(rounded::text, 3), '0');
                END IF;
                k := length(digits);
                EXIT;
            END IF;
        END LOOP;
    END IF;
    RETURN CASE WHEN negative THEN '-' ELSE '' END ||
        CASE
            WHEN k <= n AND n <= 21 THEN digits || repeat('0', n - k)
            WHEN 0 < n AND n <= 21 THEN left(digits, n) || '.' || substr(digits, n + 1)
            WHEN -6 < n AND n <= 0 THEN '0.' || repeat('0', -n) || digits
            ELSE left(digits, 1) || CASE WHEN k > 1 THEN '.' || substr(digits, 2) ELSE '' END
                 || 'e' || CASE WHEN n - 1 >= 0 THEN '+' ELSE '-' END || abs(n - 1)::text
        END;
END
$$;
COMMENT ON FUNCTION idempotency.jcs_number(text) IS
    'Trusted edition: a JSON number as ECMAScript Number::toString writes the nearest double';

-- The UTF-16 code units of a text, big-endian: the order RFC 8785 sorts names by.
CREATE FUNCTION idempotency.utf16_units(name text)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT coalesce(string_agg(
               CASE WHEN u.c < 65536 THEN decode(lpad(to_hex(u.c), 4, '0'), 'hex')
                    ELSE decode(to_hex(55296 + ((u.c - 65536) >> 10))
                                || to_hex(56320 + ((u.c - 65536) & 1023)), 'hex') END,
               ''::bytea ORDER BY u.i), ''::bytea)
      FROM (SELECT ascii(t.ch) AS c, t.i
              FROM regexp_split_to_table(name, '') WITH ORDINALITY AS t(ch, i)) AS u;
END;
COMMENT ON FUNCTION idempotency.utf16_units(text) IS
    'Trusted edition: the UTF-16 code units of a text (the JCS sort order of member names)';

-- The canonical form of an array or object at nesting level `depth` (1 for
-- the outermost); scalars are written in place, containers recurse.
CREATE FUNCTION idempotency.jcs_container(document json, depth integer, max_depth integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    result text;
    names integer;
    distinct_names integer;
    utf16 boolean;
    bytes boolean;
BEGIN
    IF depth > max_depth THEN
        RAISE EXCEPTION 'JSON nested deeper than idempotency.max_json_depth (%)', max_depth
            USING ERRCODE = '54000';
    END IF;
    IF json_typeof(document) = 'array' THEN
        SELECT '[' || coalesce(string_agg(
                   CASE json_typeof(e.value)
                       WHEN 'string' THEN to_json(e.value #>> '{}')::text
                       WHEN 'number' THEN
                           CASE WHEN e.value::text ~ '^-?(0|[1-9][0-9]{0,14})$'
                                THEN CASE WHEN e.value::text = '-0' THEN '0'
                                          ELSE e.value::text END
                                ELSE idempotency.jcs_number(e.value::text) END
                       WHEN 'object' THEN idempotency.jcs_container(e.value, depth + 1, max_depth)
                       WHEN 'array' THEN idempotency.jcs_container(e.value, depth + 1, max_depth)
                       ELSE e.value::text END, ',' ORDER BY e.ord), '') || ']'
          INTO result
          FROM json_array_elements(document) WITH ORDINALITY AS e(value, ord);
        RETURN result;
    END IF;
    SELECT count(*), count(DISTINCT m.key), bool_or(m.key ~ '[\uE000-\U0010FFFF]')
      INTO names, distinct_names, utf16
      FROM json_each(document) AS m;
    -- In a SQL_ASCII database a name is its UTF-8 bytes, which sort as UTF-16
    -- code units once the lead bytes of U+E000-U+FFFF (EE, EF) are moved above
    -- those of U+10000 and up (F0-F4), to bytes UTF-8 never has (F5, F6).
    bytes := current_setting('server_encoding') = 'SQL_ASCII';
    IF names <> distinct_names THEN
        RAISE EXCEPTION 'duplicate member name' USING ERRCODE = '22032';
    END IF;
    SELECT '{' || coalesce(string_agg(
               to_json(m.key)::text || ':' ||
               CASE json_typeof(m.value)
                   WHEN 'string' THEN to_json(m.value #>> '{}')::text
                   WHEN 'number' THEN
                       CASE WHEN m.value::text ~ '^-?(0|[1-9][0-9]{0,14})$'
                            THEN CASE WHEN m.value::text = '-0' THEN '0' ELSE m.value::text END
                            ELSE idempotency.jcs_number(m.value::text) END
                   WHEN 'object' THEN idempotency.jcs_container(m.value, depth + 1, max_depth)
                   WHEN 'array' THEN idempotency.jcs_container(m.value, depth + 1, max_depth)
                   ELSE m.value::text END, ','
               ORDER BY CASE WHEN bytes THEN convert_to(translate(m.key, chr(238) || chr(239),
                                                                  chr(245) || chr(246)), 'SQL_ASCII')
                             WHEN utf16 THEN idempotency.utf16_units(m.key)
                             ELSE convert_to(m.key, 'UTF8') END), '') || '}'
      INTO result
      FROM json_each(document) AS m;
    RETURN result;
END
$$;
COMMENT ON FUNCTION idempotency.jcs_container(json, integer, integer) IS
    'Trusted edition: the RFC 8785 form of a JSON array or object';

-- jcs of a JSON text. \u0000 escapes (which a PostgreSQL text cannot hold)
-- travel as a control character the document does not use, and lone
-- surrogate escapes, which PostgreSQL refuses as 22P02, are 22032 here as in
-- the C++ edition.
CREATE FUNCTION idempotency.jcs_text(document text, max_depth integer,
                                     exclude text[] DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    parsed json;
    stand_in text;
    result text;
    code integer;
BEGIN
    -- The walk recurses in PL/pgSQL: at max_stack_depth 2MB about 600 levels
    -- fit, so the trusted edition refuses deeper nesting (54000) at 512.
    IF document IS NULL THEN
        RETURN NULL;
    END IF;
    max_depth := least(max_depth, 512);
    -- A SQL_ASCII database keeps any bytes in a text: those that are not UTF-8
    -- are 22P02, as in the C++ edition (convert_to checks them; this
    -- subtransaction is taken in such a database only).
    IF current_setting('server_encoding') = 'SQL_ASCII' THEN
        BEGIN
            PERFORM convert_to(document, 'UTF8');
        EXCEPTION WHEN character_not_in_repertoire THEN
            RAISE EXCEPTION 'invalid UTF-8' USING ERRCODE = '22P02';
        END;
    END IF;
    IF document ~* '\\u0000' THEN
        FOR code IN 1 .. 31 LOOP
            stand_in := '\u00' || lpad(to_hex(code), 2, '0');
            EXIT WHEN position(stand_in IN lower(document)) = 0;
            stand_in := NULL;
        END LOOP;
        IF stand_in IS NULL THEN
            RAISE EXCEPTION '\u0000 in a document that escapes every control character'
                USING ERRCODE = '0A000';
        END IF;
        document := regexp_replace(document, '(?<!\\)((?:\\\\)*)\\u0000', '\1' || stand_in,
                                   'gi');
    END IF;
    IF length(document) - length(translate(document, '[{', '')) <= max_depth THEN
        parsed := document::json;
    ELSE
        -- Deep enough to be refused: PostgreSQL's parser may run out of stack
        -- first (54001), which is the C++ edition's 54000 here.
        BEGIN
            parsed := document::json;
        EXCEPTION WHEN statement_too_complex THEN
            RAISE EXCEPTION 'JSON nested deeper than idempotency.max_json_depth (%)', max_depth
                USING ERRCODE = '54000';
        END;
    END IF;
    IF document ~* '\\ud[89a-f]' THEN
        BEGIN
            result := idempotency.jcs_value(parsed, max_depth);
        EXCEPTION WHEN invalid_text_representation THEN
            RAISE EXCEPTION 'lone or reversed surrogate escape' USING ERRCODE = '22032';
        END;
    ELSE
        result := idempotency.jcs_value(parsed, max_depth);
    END IF;
    IF exclude IS NOT NULL THEN
        -- Checked whole first (a document that does not canonicalize stays raw),
        -- then canonicalized without the excluded values.
        result := idempotency.jcs_value(
            idempotency.exclude_pointers(parsed::jsonb, exclude)::json, max_depth);
    END IF;
    IF stand_in IS NOT NULL THEN
        result := regexp_replace(result, '(?<!\\)((?:\\\\)*)\' || stand_in, '\1\\u0000', 'g');
    END IF;
    RETURN result;
END
$$;
COMMENT ON FUNCTION idempotency.jcs_text(text, integer, text[]) IS
    'Trusted edition: the RFC 8785 form of a JSON text, nesting limited to max_depth, without '
    'the values that the JSON Pointer tokens in exclude (one row each) reach';

CREATE FUNCTION idempotency.jcs_value(document json, max_depth integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN CASE json_typeof(document)
               WHEN 'string' THEN to_json(document #>> '{}')::text
               WHEN 'number' THEN idempotency.jcs_number(btrim(document::text, E' \t\n\r'))
               WHEN 'object' THEN idempotency.jcs_container(document, 1, max_depth)
               WHEN 'array' THEN idempotency.jcs_container(document, 1, max_depth)
               ELSE btrim(document::text, E' \t\n\r') END;
END
$$;
COMMENT ON FUNCTION idempotency.jcs_value(json, integer) IS
    'Trusted edition: the RFC 8785 form of a parsed JSON value';

CREATE FUNCTION idempotency.jcs(document text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN idempotency.jcs_text(document,
                                idempotency.setting_int('idempotency.max_json_depth', 1000, 1,
                                                        1000000)::integer);
END
$$;
COMMENT ON FUNCTION idempotency.jcs(text) IS
    'RFC 8785 canonical form of a JSON text; rejects invalid JSON or UTF-8 (22P02), duplicate '
    'names, lone surrogates and numbers beyond a double (22032), nesting deeper than '
    'idempotency.max_json_depth (54000)';

CREATE FUNCTION idempotency.jcs(document jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN idempotency.jcs(document::text);
END
$$;
COMMENT ON FUNCTION idempotency.jcs(jsonb) IS
    'RFC 8785 canonical form of a jsonb value (numerics rounded to the nearest double); same '
    'bytes as jcs(text) for the same document';

-- The tokens of an RFC 6901 JSON Pointer (22023 when it is not one).
CREATE FUNCTION idempotency.pointer_tokens(pointer text)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pointer = '' OR left(pointer, 1) <> '/' OR pointer ~ '~([^01]|$)' THEN
        RAISE EXCEPTION 'exclude entries must be JSON Pointers to a member or element'
            USING ERRCODE = '22023';
    END IF;
    RETURN ARRAY(SELECT replace(replace(t.token, '~1', '/'), '~0', '~')
                   FROM unnest(string_to_array(substr(pointer, 2), '/'))
                        WITH ORDINALITY AS t(token, i)
                  ORDER BY t.i);
END
$$;
COMMENT ON FUNCTION idempotency.pointer_tokens(text) IS
    'Trusted edition: the unescaped tokens of a JSON Pointer (22023 for another text)';

-- The document without the values the pointers reach, all resolved against
-- the original: an array index is 0 or digits without a leading zero; higher
-- indexes are removed first, and a pointer below another is dropped.
CREATE FUNCTION idempotency.exclude_pointers(document jsonb, paths text[][])
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found text[] := '{}';
    tokens text[];
    token text;
    node jsonb;
    ok boolean;
    i integer;
BEGIN
    FOR i IN 1 .. coalesce(array_length(paths, 1), 0) LOOP
        tokens := ARRAY(SELECT p FROM unnest(paths[i:i]) AS p WHERE p IS NOT NULL);
        node := document;
        ok := true;
        FOREACH token IN ARRAY tokens LOOP
            IF jsonb_typeof(node) = 'array' THEN
                ok := token ~ '^(0|[1-9][0-9]{0,8})$'
                      AND token::integer < jsonb_array_length(node);
                node := CASE WHEN ok THEN node -> token::integer END;
            ELSIF jsonb_typeof(node) = 'object' THEN
                node := node -> token;
                ok := node IS NOT NULL;
            ELSE
                ok := false;
            END IF;
            EXIT WHEN NOT ok;
        END LOOP;
        IF ok THEN
            found := found || ARRAY[array_to_json(tokens)::text];
        END IF;
    END LOOP;
    FOR tokens IN
        SELECT ARRAY(SELECT json_array_elements_text(f::json)) FROM unnest(found) AS f
         GROUP BY f
         ORDER BY ARRAY(SELECT CASE WHEN t ~ '^[0-9]+$' THEN lpad(t, 20, '0') ELSE t END
                          FROM json_array_elements_text(f::json) AS t) DESC
    LOOP
        -- Dropped when a shorter pointer also matched: its value goes anyway.
        CONTINUE WHEN EXISTS (
            SELECT FROM unnest(found) AS g
             WHERE json_array_length(g::json) < cardinality(tokens)
               AND ARRAY(SELECT json_array_elements_text(g::json))
                   = tokens[1:json_array_length(g::json)]);
        document := document #- tokens;
    END LOOP;
    RETURN document;
END
$$;
COMMENT ON FUNCTION idempotency.exclude_pointers(jsonb, text[]) IS
    'Trusted edition: a document without the members and elements JSON Pointers reach';

CREATE FUNCTION idempotency.fingerprint(method text, path text, body bytea DEFAULT NULL,
                                        exclude text[] DEFAULT NULL)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 1
AS $$
DECLARE
    max_depth integer := idempotency.setting_int('idempotency.max_json_depth', 1000, 1,
                                                 1000000)::integer;
    canonical bytea := ''::bytea;
    pointer text;
    tokens text[] := '{}';
    document text;
    width integer := 0;
BEGIN
    IF method IS NULL OR path IS NULL OR array_position(exclude, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'method, path and exclude elements must not be null'
            USING ERRCODE = '22004';
    END IF;
    IF method !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN
        RAISE EXCEPTION 'method must be an HTTP token' USING ERRCODE = '22023';
    END IF;
    IF position(E'\n' IN path) > 0 THEN
        RAISE EXCEPTION 'path must not contain a line feed' USING ERRCODE = '22023';
    END IF;
    FOREACH pointer IN ARRAY coalesce(exclude, '{}') LOOP
        width := greatest(width, cardinality(idempotency.pointer_tokens(pointer)));
    END LOOP;
    IF body IS NOT NULL AND octet_length(body) > 0 THEN
        BEGIN
            IF width = 0 THEN
                document := idempotency.jcs_text(convert_from(body, 'UTF8'), max_depth);
            ELSE
                -- Pointers as rows of one array (NULL-padded to the longest).
                SELECT array_agg(array_cat(t.tokens, array_fill(NULL::text,
                                 ARRAY[width - cardinality(t.tokens)])) ORDER BY t.i)
                  INTO tokens
                  FROM (SELECT idempotency.pointer_tokens(p) AS tokens, i
                          FROM unnest(exclude) WITH ORDINALITY AS e(p, i)) AS t;
                document := idempotency.jcs_text(convert_from(body, 'UTF8'), max_depth, tokens);
            END IF;
            canonical := convert_to(document, 'UTF8');
        EXCEPTION
            WHEN invalid_text_representation OR invalid_json_text
                 OR character_not_in_repertoire OR untranslatable_character
                 OR feature_not_supported THEN
                canonical := body;
        END;
    END IF;
    RETURN sha256(convert_to(upper(method) || E'\n' || path || E'\n', 'UTF8') || canonical);
END
$$;
COMMENT ON FUNCTION idempotency.fingerprint(text, text, bytea, text[]) IS
    'SHA-256 of upper(method) || LF || path || LF || canonical body (jcs of JSON bodies, raw '
    'bytes otherwise), after removing the members the exclude JSON Pointers name';
