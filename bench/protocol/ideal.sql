-- ideal: plain SQL in place of begin/complete: an index lookup of the key, then
-- one INSERT of the final key row, no key lock. A baseline for the same steps
-- done through SQL, not a lower bound: the extension does them below SQL (direct
-- index and heap access, no parse or plan) and measures faster. Not correct
-- under concurrency (two requests with one key both run).
\set k random(1, 4000000000000000000)
BEGIN;
SELECT 1 FROM bench.ideal_keys WHERE principal = 'acme' AND key = :k;
INSERT INTO bench.effects (principal, order_ref, amount) VALUES ('acme', :k, 100);
INSERT INTO bench.ideal_keys (principal, key, action, request_sha256, state, response_status, response_headers, response_body, resource_id, one_time_secret, created_at, expires_at) VALUES ('acme', :k, 'create_order', '\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea, 'completed', 201, '{"content-type": "application/json"}'::jsonb, '\x7b226964223a226f72645f31222c22616d6f756e74223a3130307d'::bytea, 'ord_1', false, now(), now() + interval '1 day');
COMMIT;
