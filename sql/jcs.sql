-- idempotency.jcs: RFC 8785 canonical form, text and jsonb forms.
-- Errors are shown by SQLSTATE only; the wording may change.
\set VERBOSITY sqlstate

-- Whitespace removed, members sorted, arrays kept in order.
SELECT idempotency.jcs('{ "b" : [3, 1, 2], "a" : { "y": null, "x": true } }');
-- Sorting by UTF-16 code units: U+1F600 (surrogates D83D DE00) before U+FF21.
SELECT idempotency.jcs(E'{"\uFF21":1,"\U0001F600":2,"a":3}') = E'{"a":3,"\U0001F600":2,"\uFF21":1}' AS utf16_order;
-- Escapes as JSON.stringify writes them.
SELECT idempotency.jcs('["\u0000\u001f\b\t\n\f\r\"\\\/\u0041\u00e9"]');
SELECT idempotency.jcs('"\uD83D\uDE00"') = E'"\U0001F600"' AS surrogate_pair;
-- Numbers as ECMAScript Number::toString of the nearest double.
SELECT idempotency.jcs('[-0, 0.0, 1.0, 1E+2, 1e21, 1e20, 1e-7, 0.000001, 5e-324, 1e-400]');
SELECT idempotency.jcs('[9007199254740993, 295147905179352825856, 0.1234567890123456789, 333333333.33333329]');
-- Primitives and a string with leading spaces.
SELECT idempotency.jcs(' true '), idempotency.jcs('null'), idempotency.jcs('"  lead"');
-- STRICT: NULL in, NULL out.
SELECT idempotency.jcs(NULL::text) IS NULL AS null_in_null_out;

-- The jsonb form gives the same bytes as the text form.
SELECT idempotency.jcs(d::jsonb) = idempotency.jcs(d) AS same_bytes, idempotency.jcs(d::jsonb)
FROM (VALUES ('{"b":[1.50,2e3,-0],"a":{"\u00e9":"x","e":"\n"}}'),
             ('[1e-7, 123456789012345678901234567890, 0.1]'),
             (E'{"\uFF21":1,"\U0001F600":2}'),
             ('"plain"')) AS t(d);

-- Bad input: invalid JSON (22P02).
SELECT idempotency.jcs('');
SELECT idempotency.jcs('   ');
SELECT idempotency.jcs('{"a":1} x');
SELECT idempotency.jcs('[1,]');
SELECT idempotency.jcs('[NaN]');
SELECT idempotency.jcs('[Infinity]');
SELECT idempotency.jcs('[01]');
SELECT idempotency.jcs('"tab	inside"');
-- JSON that RFC 8785 cannot canonicalize (22032).
SELECT idempotency.jcs('{"a":1,"a":2}');
SELECT idempotency.jcs('{"a":1,"\u0061":2}');
SELECT idempotency.jcs('"\uD800"');
SELECT idempotency.jcs('"\uDE00\uD83D"');
SELECT idempotency.jcs('1e400');
-- Too deep (54000); the limit is a setting, and the parser never recurses.
SELECT idempotency.jcs(repeat('[', 100000));
SET idempotency.max_json_depth = 100000;
SELECT length(idempotency.jcs(repeat('[', 100000) || repeat(']', 100000))) AS deep_ok;
SELECT idempotency.jcs(repeat('[', 100000));
SET idempotency.max_json_depth = 2;
SELECT idempotency.jcs('[[1]]');
SELECT idempotency.jcs('[[[1]]]');
RESET idempotency.max_json_depth;
SET idempotency.max_json_depth = 0;
SET idempotency.nonexistent = 1;

-- A 64 MiB document.
SELECT length(idempotency.jcs('[' || repeat('{"b":1.50,"a":"xyz"},', 3300000) || '0]')) AS big_length;
-- The backend is still fine after all of the above.
SELECT idempotency.jcs('{"ok":true}');
