\set t random(0, 999)
-- base: the handler's transaction alone, no idempotency key.
\set k random(1, 4000000000000000000)
BEGIN;
INSERT INTO bench.effects (principal, order_ref, amount) VALUES (('tenant_' || :t::int), :k, 100);
COMMIT;
