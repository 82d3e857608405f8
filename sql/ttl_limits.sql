-- A ttl is more than 0 and at most 366 days, checked on the timestamps it
-- gives: now() + ttl, by PostgreSQL's own timestamptz + interval, must be
-- after now() and at most now() + '366 days'. A month is not 30 days there, so
-- '12 mon 6 days' (at least 371 days) and '11 mon 36 days' (at least 370) are
-- refused; 0.6.0 summed the fields with 30-day months and accepted both.
-- Every function that takes a ttl, every case; '1 year 1 day' is 366 days or
-- 367 depending on the date, so its expected answer is computed the same way.
\set VERBOSITY sqlstate
CREATE FUNCTION pg_temp.try_ttl(fn text, ttl interval) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fp bytea := idempotency.fingerprint('POST', '/ttl');
    k text := gen_random_uuid()::text;  -- a begun key stays pending in the transaction
    stored interval;
BEGIN
    CASE fn
        WHEN 'begin' THEN PERFORM idempotency.begin('ttl', k, 'a', fp, ttl => ttl);
                          PERFORM idempotency.complete('ttl', k, 201);
        WHEN 'save_final' THEN PERFORM idempotency.save_final('ttl', k, 'a', fp, 422, ttl => ttl);
        WHEN 'acquire' THEN PERFORM idempotency.acquire('ttl', k, 'a', fp, ttl => ttl);
        WHEN 'claim' THEN PERFORM idempotency.claim('ttl', k, ttl => ttl);
    END CASE;
    SELECT r.expires_at - r.created_at INTO stored FROM idempotency.keys AS r
     WHERE r.principal = 'ttl' AND r.key = k;
    DELETE FROM idempotency.keys WHERE principal = 'ttl';
    RETURN CASE WHEN stored = (now() + ttl) - now() THEN 'accepted' ELSE 'stored ' || stored END;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$$;
CREATE TEMP TABLE cases (ttl interval, label text);
INSERT INTO cases VALUES ('366 days', '366 days'), ('12 mon 6 days', '12 mon 6 days'),
    ('11 mon 36 days', '11 mon 36 days'), ('1 year 1 day', '1 year 1 day'),
    ('366 days 1 microsecond', '366 days 1 microsecond'), ('365 days 24:00:00', '365 days 24:00:00'),
    ('365 days 24:00:00.000001', '365 days 24:00:00.000001'), ('1 year -1 day', '1 year -1 day'),
    ('13 mon -40 days', '13 mon -40 days'), ('-1 mon 40 days', '-1 mon 40 days'),
    ('1 day -24:00:00', '1 day -24:00:00'), ('-1 day', '-1 day'), ('1 microsecond', '1 microsecond'),
    ('1000 years', '1000 years'), ('178000000 years', '178000000 years'),
    ('-178000000 years 1 day', '-178000000 years 1 day');
-- What each function answers: accepted (storing exactly now() + ttl) or 22023.
SELECT c.label, f.fn,
       pg_temp.try_ttl(f.fn, c.ttl) AS answer,
       CASE WHEN c.ttl > '100 years' OR c.ttl < '-100 years' THEN '22023'
            WHEN now() + c.ttl > now() AND now() + c.ttl <= now() + interval '366 days' THEN 'accepted'
            ELSE '22023' END AS expected
  FROM cases AS c, (VALUES ('begin'), ('save_final'), ('acquire'), ('claim')) AS f(fn)
 WHERE pg_temp.try_ttl(f.fn, c.ttl) IS DISTINCT FROM
       CASE WHEN c.ttl > '100 years' OR c.ttl < '-100 years' THEN '22023'
            WHEN now() + c.ttl > now() AND now() + c.ttl <= now() + interval '366 days' THEN 'accepted'
            ELSE '22023' END;
-- The named cases, whatever the date:
SELECT f.fn, pg_temp.try_ttl(f.fn, '366 days') AS "366 days",
       pg_temp.try_ttl(f.fn, '12 mon 6 days') AS "12 mon 6 days",
       pg_temp.try_ttl(f.fn, '11 mon 36 days') AS "11 mon 36 days",
       pg_temp.try_ttl(f.fn, '366 days 1 microsecond') AS "366 days 1 us",
       pg_temp.try_ttl(f.fn, '1 year -1 day') AS "1 year -1 day",
       pg_temp.try_ttl(f.fn, '-1 day') AS "-1 day"
  FROM (VALUES ('begin'), ('save_final'), ('acquire'), ('claim')) AS f(fn) ORDER BY 1;
-- The message.
\set VERBOSITY terse
SELECT idempotency.claim('ttl', 'k', ttl => '12 mon 6 days');
