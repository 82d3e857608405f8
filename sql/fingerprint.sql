-- idempotency.fingerprint: SHA-256(upper(method) LF path LF canonical body).
\set VERBOSITY sqlstate

-- The layout, checked against the built-in sha256().
SELECT idempotency.fingerprint('post', '/orders', convert_to('{"b":1,"a":2}', 'UTF8'))
     = sha256(convert_to(E'POST\n/orders\n{"a":2,"b":1}', 'UTF8')) AS layout;
SELECT idempotency.fingerprint('POST', '/orders') = sha256(convert_to(E'POST\n/orders\n', 'UTF8')) AS no_body;
SELECT idempotency.fingerprint('POST', '/orders', ''::bytea) = idempotency.fingerprint('POST', '/orders') AS empty_is_absent;
SELECT length(idempotency.fingerprint('GET', '/')) AS digest_bytes;

-- Member order, whitespace and escapes do not change the fingerprint.
SELECT idempotency.fingerprint('POST', '/pay', convert_to('{"amount":1000,"currency":"eur","note":"caf\u00e9 \/ 1"}', 'UTF8'))
     = idempotency.fingerprint('POST', '/pay', convert_to(E'{ "note" : "café / 1",\n  "currency" : "\\u0065ur", "amount" : 1e3 }', 'UTF8'))
       AS reordered_equal;
-- ... but the content does, and so do method and path.
SELECT idempotency.fingerprint('POST', '/pay', convert_to('{"amount":1000}', 'UTF8'))
     = idempotency.fingerprint('POST', '/pay', convert_to('{"amount":1001}', 'UTF8')) AS other_amount_equal;
SELECT idempotency.fingerprint('POST', '/pay', convert_to('{}', 'UTF8'))
     = idempotency.fingerprint('PUT', '/pay', convert_to('{}', 'UTF8')) AS other_method_equal;
SELECT idempotency.fingerprint('POST', '/pay', convert_to('{}', 'UTF8'))
     = idempotency.fingerprint('POST', '/pay/', convert_to('{}', 'UTF8')) AS other_path_equal;

-- Bodies that are not JSON (or not canonicalizable) are hashed as raw bytes.
SELECT idempotency.fingerprint('POST', '/f', b) = sha256(convert_to(E'POST\n/f\n', 'UTF8') || b) AS raw, b
FROM (VALUES (convert_to('a=1&b=2', 'UTF8')), (convert_to('{"a":1,"a":2}', 'UTF8')), ('\xfffe'::bytea),
             (convert_to('[1e400]', 'UTF8')), (convert_to('"\uD800"', 'UTF8')), (convert_to('  ', 'UTF8')),
             (convert_to('[1,]', 'UTF8'))) AS t(b);

-- exclude: RFC 6901 pointers, ~1 for '/', ~0 for '~'; unmatched pointers are ignored.
SELECT idempotency.fingerprint('POST', '/e', convert_to('{"x":1,"meta":{"ts":"2026-01-01","id":7},"a/b":2,"m~n":3,"l":[0,1]}', 'UTF8'),
                               ARRAY['/meta/ts', '/a~1b', '/m~0n', '/l/0', '/missing', '/l/7'])
     = sha256(convert_to(E'POST\n/e\n{"l":[1],"meta":{"id":7},"x":1}', 'UTF8')) AS excluded;
SELECT idempotency.fingerprint('POST', '/e', convert_to('{"x":1,"nonce":"a"}', 'UTF8'), ARRAY['/nonce'])
     = idempotency.fingerprint('POST', '/e', convert_to('{"nonce":"b","x":1}', 'UTF8'), ARRAY['/nonce']) AS nonce_ignored;
SELECT idempotency.fingerprint('POST', '/e', convert_to('{"x":1}', 'UTF8'), '{}')
     = idempotency.fingerprint('POST', '/e', convert_to('{"x":1}', 'UTF8')) AS empty_exclude;
-- exclude does not apply to raw bodies.
SELECT idempotency.fingerprint('POST', '/e', 'x=1'::bytea, ARRAY['/x']) = sha256(convert_to(E'POST\n/e\nx=1', 'UTF8')) AS raw_exclude;

-- The text and jsonb forms agree with the fingerprint's canonical body.
SELECT idempotency.fingerprint('POST', '/j', convert_to(d, 'UTF8'))
     = sha256(convert_to(E'POST\n/j\n' || idempotency.jcs(d::jsonb), 'UTF8')) AS jsonb_agrees
FROM (VALUES ('{"b":[1.50,2e3],"a":"\u00e9"}'), ('[{"z":1,"y":{"x":[]}}]')) AS t(d);

-- Bad arguments.
SELECT idempotency.fingerprint(NULL, '/p');
SELECT idempotency.fingerprint('POST', NULL);
SELECT idempotency.fingerprint('', '/p');
SELECT idempotency.fingerprint(E'PO\nST', '/p');
SELECT idempotency.fingerprint('POST /x', '/p');
SELECT idempotency.fingerprint('POST', E'/p\n/q');
SELECT idempotency.fingerprint('POST', '/p', '{}'::bytea, ARRAY['nope']);
SELECT idempotency.fingerprint('POST', '/p', '{}'::bytea, ARRAY['']);
SELECT idempotency.fingerprint('POST', '/p', '{}'::bytea, ARRAY['/a~2']);
SELECT idempotency.fingerprint('POST', '/p', '{}'::bytea, ARRAY[NULL]);
-- Too deep JSON is an error, never a silent raw-bytes digest.
SELECT idempotency.fingerprint('POST', '/p', convert_to(repeat('[', 2000) || repeat(']', 2000), 'UTF8'));
