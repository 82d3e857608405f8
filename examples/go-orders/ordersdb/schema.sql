-- The example's tables (examples/go-orders/main.go makes them; sqlc reads this file).
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, principal text NOT NULL,
  item text NOT NULL, quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS api_keys (id bigserial PRIMARY KEY, principal text NOT NULL,
  name text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
