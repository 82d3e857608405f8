package ordersdb

import (
	"github.com/jackc/pgx/v5/pgtype"
)

// Order is a row of orders.
type Order struct {
	ID        int64              // id bigserial
	Principal string             // principal text
	Item      string             // item text
	Quantity  int32              // quantity int
	CreatedAt pgtype.Timestamptz // created_at timestamptz
}
