// Package ordersdb is the orders table's queries in the shape sqlc generates for
// pgx v5 (sqlc.yaml: sql_package "pgx/v5"), from schema.sql and query.sql here.
// Written by hand in that shape (the example needs no sqlc binary); what sqlc
// generates from these files has the same types and methods, so `sqlc generate`
// can replace them. New takes a DBTX: a pgxpool.Pool, a pgx.Conn, or the pgx.Tx
// the idempotency middleware hands a handler, which is the point of the example:
// the queries run in the transaction that holds the key.
package ordersdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what the queries run on: a pool, a connection or a transaction.
type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
}

// New returns the queries over db.
func New(db DBTX) *Queries {
	return &Queries{db: db}
}

// Queries holds the generated query methods.
type Queries struct {
	db DBTX
}

// WithTx returns the queries over tx.
func (q *Queries) WithTx(tx pgx.Tx) *Queries {
	return &Queries{
		db: tx,
	}
}
