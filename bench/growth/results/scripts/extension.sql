\set t random(0, 999)
-- extension: idempotency.begin / idempotency.complete (complete fails unless begin said started).
\set k random(1, 4000000000000000000)
BEGIN;
SELECT * FROM idempotency.begin(('tenant_' || :t::int), :k, 'create_order', '\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2'::bytea);
INSERT INTO bench.effects (principal, order_ref, amount) VALUES (('tenant_' || :t::int), :k, 100);
SELECT idempotency.complete(('tenant_' || :t::int), :k, 201, '\x7b226964223a226f72645f31222c22616d6f756e74223a3130307d'::bytea, '{"content-type": "application/json"}'::jsonb, 'ord_1');
COMMIT;
