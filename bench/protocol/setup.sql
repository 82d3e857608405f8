-- Tables shared by the pgbench scripts (run after CREATE EXTENSION idempotency).

CREATE SCHEMA bench;

-- The handler's effect: one row per request, the same in every variant.
CREATE TABLE bench.effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    principal  text        NOT NULL,
    order_ref  text        NOT NULL,
    amount     integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- "ideal": plain SQL against a table of exactly the shape of idempotency.keys
-- (same columns, defaults, CHECK constraints, primary key and expires_at index).
CREATE TABLE bench.ideal_keys (LIKE idempotency.keys INCLUDING ALL);
