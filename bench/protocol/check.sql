-- Before timing: the extension and the peer give the same outcomes for the
-- same calls (started, replay, mismatch), and complete() refuses a key that
-- begin() did not start. Prints one line per case; run.sh compares them.
\set fp '''\\x3393929e3059a234f3a1eb45f2fda39fcbf73f91a832e8abfd5de6960453eec2''::bytea'
\set other '''\\x0000000000000000000000000000000000000000000000000000000000000000''::bytea'
\set body '''\\x7b7d''::bytea'
BEGIN;
SELECT 'ext  started ', outcome FROM idempotency.begin('acme', 'check-1', 'create_order', :fp);
SELECT 'ext  complete', idempotency.complete('acme', 'check-1', 201, :body, '{"a":"b"}', 'ord_1');
COMMIT;
SELECT 'ext  replay  ', outcome, response_status, response_body = :body FROM idempotency.begin('acme', 'check-1', 'create_order', :fp);
SELECT 'ext  mismatch', outcome, resource_id FROM idempotency.begin('acme', 'check-1', 'create_order', :other);
BEGIN;
SELECT 'peer started ', outcome FROM peer.begin('acme', 'check-1', 'create_order', :fp);
SELECT 'peer complete', peer.complete('acme', 'check-1', 201, :body, '{"a":"b"}', 'ord_1');
COMMIT;
SELECT 'peer replay  ', outcome, response_status, response_body = :body FROM peer.begin('acme', 'check-1', 'create_order', :fp);
SELECT 'peer mismatch', outcome, resource_id FROM peer.begin('acme', 'check-1', 'create_order', :other);
