package idempotency

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Round trips of a keyed request against the same handler in a plain pgx
// transaction, counted as the client's writes on the socket (pgx writes each
// round trip's messages with one Write call). Each form runs once first, so
// pgx's statement cache is warm, as on a long-lived connection.
func TestRoundTripsAreThoseOfAPlainTransaction(t *testing.T) {
	ordersTable(t)
	ctx, who := context.Background(), principal(t)
	var writes int64
	conn := connectCounting(t, &writes)
	client := newClient(t, Options{})
	insert := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO go_orders (principal, item) VALUES ($1, 'rt')", who)
		return err
	}
	handler := func(status int) Handler {
		return func(ctx context.Context, tx pgx.Tx) (Response, error) {
			return Response{Status: status, Body: []byte("{}")}, insert(ctx, tx)
		}
	}
	measure := func(run func() error) int64 {
		before := atomic.LoadInt64(&writes)
		if err := run(); err != nil {
			t.Fatal(err)
		}
		return atomic.LoadInt64(&writes) - before
	}
	plain := func() error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return insert(ctx, tx) })
	}
	keyed := func(key string, status int) func() error {
		return func() error {
			_, err := client.Handle(ctx, conn, orderRequest(who, key, order), handler(status))
			return err
		}
	}
	measure(plain)
	measure(keyed("warm", 201))
	measure(keyed("warm-error", 404))
	cases := []struct {
		name string
		run  func() error
		want int64
	}{
		{"plain transaction, one statement", plain, 3},
		{"keyed, first time", keyed("first", 201), 3},
		{"replay", keyed("first", 201), 2},
		{"final error", keyed("error", 404), 3},
		{"mismatch", func() error {
			_, err := client.Handle(ctx, conn, orderRequest(who, "first", "{}"), handler(201))
			return err
		}, 2},
	}
	for _, c := range cases {
		if got := measure(c.run); got != c.want {
			t.Errorf("%s: %d round trips, want %d", c.name, got, c.want)
		}
	}
}
