package idempotency

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The handler's pgx.Tx (pgx v5's interface) does what pgx's own does, except
// ending the transaction: savepoints, pgx.BeginFunc, CopyFrom, SendBatch and
// LargeObjects, all committed with the key.
func TestTheHandlersTxIsAWholePgxTx(t *testing.T) {
	ordersTable(t)
	ctx, who := context.Background(), principal(t)
	var oid uint32
	handler := func(ctx context.Context, tx pgx.Tx) (Response, error) {
		if err := tx.Commit(ctx); !errors.Is(err, ErrAttemptOwnsTransaction) {
			t.Errorf("Commit: %v", err)
		}
		insert := func(tx pgx.Tx, item string) error {
			_, err := tx.Exec(ctx, "INSERT INTO go_orders (principal, item) VALUES ($1, $2)", who,
				item)
			return err
		}
		undone := errors.New("undone")
		if err := pgx.BeginFunc(ctx, tx, func(nested pgx.Tx) error {
			if err := insert(nested, "rolled back"); err != nil {
				return err
			}
			return undone
		}); !errors.Is(err, undone) {
			return Response{}, err
		}
		if err := pgx.BeginFunc(ctx, tx, func(nested pgx.Tx) error {
			return insert(nested, "savepoint")
		}); err != nil {
			return Response{}, err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"go_orders"}, []string{"principal", "item"},
			pgx.CopyFromRows([][]any{{who, "copied"}})); err != nil {
			return Response{}, err
		}
		batch := &pgx.Batch{}
		batch.Queue("INSERT INTO go_orders (principal, item) VALUES ($1, 'batched')", who)
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return Response{}, err
		}
		objects := tx.LargeObjects()
		var err error
		if oid, err = objects.Create(ctx, 0); err != nil {
			return Response{}, err
		}
		object, err := objects.Open(ctx, oid, pgx.LargeObjectModeWrite)
		if err == nil {
			_, err = object.Write([]byte("receipt"))
		}
		if err == nil {
			err = object.Close()
		}
		return Response{Status: 201, Body: []byte("{}")}, err
	}
	response, err := newClient(t, Options{}).Handle(ctx, connect(t), orderRequest(who, "tx", order),
		handler)
	if err != nil || response.Status != 201 {
		t.Fatalf("%+v %v", response, err)
	}
	if n := scalarInt(t, "SELECT count(*) FROM go_orders"+
		" WHERE principal = $1 AND item <> 'rolled back'", who); n != 3 || orders(t, who) != 3 {
		t.Fatalf("%d orders kept, %d in all", n, orders(t, who))
	}
	if n := scalarInt(t, "SELECT length(lo_get($1::oid))", int64(oid)); n != 7 {
		t.Fatalf("large object of %d bytes", n)
	}
	exec1(t, "SELECT lo_unlink($1::oid)", int64(oid))
}
