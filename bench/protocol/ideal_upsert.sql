-- diagnostic: ideal, with the key row written the way the extension's complete() writes it
-- (INSERT ... ON CONFLICT DO UPDATE ... WHERE, a speculative insertion).
\set k random(1, 4000000000000000000)
BEGIN;
SELECT 1 FROM bench.ideal_keys WHERE principal = 'acme' AND key = :k;
INSERT INTO bench.effects (principal, order_ref, amount) VALUES ('acme', :k, 100);
INSERT INTO bench.ideal_keys AS k (principal, key, action, request_sha256, state, response_status, response_headers, response_body, resource_id, one_time_secret, created_at, expires_at) VALUES ('acme', :k, 'create_order', '\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea, 'completed', 201, '{"content-type": "application/json"}'::jsonb, '\x7b226964223a226f72645f31222c22616d6f756e74223a3130307d'::bytea, 'ord_1', false, now(), now() + interval '1 day') ON CONFLICT (principal, key) DO UPDATE SET action = excluded.action, request_sha256 = excluded.request_sha256, state = 'completed', response_status = excluded.response_status, response_headers = excluded.response_headers, response_body = excluded.response_body, resource_id = excluded.resource_id, one_time_secret = excluded.one_time_secret, fence = k.fence + 1, lease_until = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at WHERE k.expires_at <= now() OR (k.state = 'in_progress' AND k.lease_until <= clock_timestamp());
COMMIT;
