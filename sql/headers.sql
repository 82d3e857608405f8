-- Stored headers: an object of name -> value, or an array of [name, value]
-- pairs that keeps order and repeated names; names and values are checked.
\set VERBOSITY sqlstate
CREATE FUNCTION h_fp() RETURNS bytea LANGUAGE sql IMMUTABLE
    AS $$ SELECT idempotency.fingerprint('POST', '/h') $$;
-- Repeated Set-Cookie and their order survive a replay.
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'h-1', 'a', h_fp());
SELECT idempotency.complete('p', 'h-1', 201, convert_to('ok', 'UTF8'),
       '[["Set-Cookie","a=1; Path=/"],["Location","/o/1"],["Set-Cookie","b=2"]]');
COMMIT;
SELECT outcome, response_headers FROM idempotency.begin('p', 'h-1', 'a', h_fp());
SELECT jsonb_typeof(response_headers) FROM idempotency.keys WHERE key = 'h-1';
-- The object form is still accepted, through every function that stores headers.
SELECT idempotency.save_final('p', 'h-2', 'a', h_fp(), 404, NULL, '{"Content-Type":"text/plain"}') AS object_form;
SELECT fence AS h3 FROM idempotency.acquire('p', 'h-3', 'a', h_fp()) \gset
SELECT idempotency.complete('p', 'h-3', 200, NULL, '[["ETag","\"v1\""]]', fence => :h3) AS pairs_with_fence;
SELECT key, response_headers FROM idempotency.keys WHERE key IN ('h-2', 'h-3') ORDER BY key;
-- Refused with 22023, storing nothing.
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '"Location: /"');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '{"Bad Name":"x"}');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '{"X-Split":"a\r\nSet-Cookie: evil=1"}');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '{"X-Count":3}');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '{"X-Nested":{"a":"b"}}');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '[["Location"]]');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '[["Location","/","extra"]]');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '["Location","/"]');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '[["Location:","/"]]');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '[["Location","a\nb"]]');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '[["",""]]');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '[[":status","200"]]');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '[[":chunks","1\n2"]]');
SELECT idempotency.save_final('p', 'h-x', 'a', h_fp(), 404, NULL, '{":Chunks":"1"}');
SELECT count(*) AS nothing_stored FROM idempotency.keys WHERE key = 'h-x';
-- The clients' reserved entries of a streamed response (docs/http.md), and no
-- other name that starts with a colon (above).
SELECT idempotency.save_final('p', 'h-6', 'a', h_fp(), 404, convert_to('aabbb', 'UTF8'),
       '[["Content-Type","text/plain"],[":chunks","2,3"]]') AS chunks_entry,
       idempotency.save_final('p', 'h-7', 'a', h_fp(), 404, NULL, '{":not_kept":"stream-too-large"}')
       AS not_kept_entry;
SELECT key, response_headers FROM idempotency.keys WHERE key IN ('h-6', 'h-7') ORDER BY key;
-- Empty forms are fine.
SELECT idempotency.save_final('p', 'h-4', 'a', h_fp(), 404, NULL, '[]') AS empty_pairs,
       idempotency.save_final('p', 'h-5', 'a', h_fp(), 404, NULL, '{}') AS empty_object;
DELETE FROM idempotency.keys;
DROP FUNCTION h_fp();
