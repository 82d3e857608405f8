-- The plain single node of bench/scale-out/citus.sh and citus_instructions.sh (run
-- with psql -f against its database postgres): the database shop with the
-- extension and the orders table of tests/scale-out/citus_cluster.sh, not distributed.
CREATE DATABASE shop;
\c shop
CREATE EXTENSION idempotency;
CREATE TABLE orders (id bigserial, principal text NOT NULL, item text NOT NULL, quantity int NOT NULL,
                     created_at text NOT NULL DEFAULT now()::text, PRIMARY KEY (principal, id));
