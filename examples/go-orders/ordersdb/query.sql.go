// source: query.sql

package ordersdb

import (
	"context"
)

const countOrders = `-- name: CountOrders :one
SELECT count(*) FROM orders WHERE principal = $1
`

// CountOrders counts the orders of a principal.
func (q *Queries) CountOrders(ctx context.Context, principal string) (int64, error) {
	row := q.db.QueryRow(ctx, countOrders, principal)
	var count int64
	err := row.Scan(&count)
	return count, err
}

const createOrder = `-- name: CreateOrder :one
INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, $3)
RETURNING id, principal, item, quantity, created_at
`

// CreateOrderParams are CreateOrder's arguments.
type CreateOrderParams struct {
	Principal string // $1
	Item      string // $2
	Quantity  int32  // $3
}

// CreateOrder inserts an order and returns its row.
func (q *Queries) CreateOrder(ctx context.Context, arg CreateOrderParams) (Order, error) {
	row := q.db.QueryRow(ctx, createOrder, arg.Principal, arg.Item, arg.Quantity)
	var i Order
	err := row.Scan(
		&i.ID,
		&i.Principal,
		&i.Item,
		&i.Quantity,
		&i.CreatedAt,
	)
	return i, err
}
