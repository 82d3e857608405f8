-- base: the handler's transaction alone, no idempotency key.
\set k random(1, 4000000000000000000)
BEGIN;
INSERT INTO bench.effects (principal, order_ref, amount) VALUES ('acme', :k, 100);
COMMIT;
