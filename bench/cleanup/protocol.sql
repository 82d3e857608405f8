-- One keyed request through the transactional protocol, with a fresh key.
\set n random(1, 1000000000)
BEGIN;
SELECT outcome FROM idempotency.begin('bench', :client_id || '-' || :n || '-' || txid_current(), 'create_order', '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea);
INSERT INTO effects (client, note) VALUES (:client_id, 'order');
SELECT idempotency.complete('bench', :client_id || '-' || :n || '-' || txid_current(), 201, '\x7b7d'::bytea);
COMMIT;
