package ordersdb

import (
	"github.com/jackc/pgx/v5/pgtype"
)

// Order is a row of orders.
type Order struct {
	ID        int64
	Principal string
	Item      string
	Quantity  int32
	CreatedAt pgtype.Timestamptz
}
