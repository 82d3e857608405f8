-- floor: the protocol's round trips, with no-op SELECTs in place of begin and complete.
\set k random(1, 4000000000000000000)
BEGIN;
SELECT 1;
INSERT INTO bench.effects (principal, order_ref, amount) VALUES ('acme', :k, 100);
SELECT 1;
COMMIT;
