-- name: CreateOrder :one
INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, $3)
RETURNING id, principal, item, quantity, created_at;

-- name: CountOrders :one
SELECT count(*) FROM orders WHERE principal = $1;
