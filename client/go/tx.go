package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

// ErrAttemptOwnsTransaction is returned by Commit and Rollback of the pgx.Tx a
// handler receives: the client commits (with the key row) or rolls back itself.
// Return an error from the handler to roll back.
var ErrAttemptOwnsTransaction = errors.New(
	"idempotency: the attempt owns the transaction; return from the handler instead of committing")

// attemptTx is the pgx.Tx a handler runs in. The client opened it by sending
// BEGIN in one batch with idempotency.begin (pgx's own Tx would cost a round
// trip of its own for BEGIN), so it is a thin view of the connection.
type attemptTx struct {
	conn       *pgx.Conn
	expires    *int64 // the key row's expiry (the middleware's stream headers)
	savepoints int
	// retryable is the first serialization failure or deadlock a statement of
	// the handler met: the attempt is then rerun whatever the handler answered
	// (an HTTP handler cannot return the error itself).
	retryable error
	// stale is set when a statement of the handler met IsStalePlacement: the
	// middleware reports the principal's placement (ReportStalePlacement).
	stale bool
	// fault is the first database fault (IsDatabaseFault) a statement of the
	// handler met: the attempt fails with it whatever the handler answered (its
	// transaction is aborted or its connection gone; nothing can be kept).
	fault error
}

// note remembers a serialization failure, a deadlock or a stale placement and returns err.
func (t *attemptTx) note(err error) error {
	if err != nil && t.retryable == nil && Retryable(err) {
		t.retryable = err
	}
	if err != nil && IsStalePlacement(err) {
		t.stale = true
	}
	if err != nil && t.fault == nil && IsDatabaseFault(err) {
		t.fault = err
	}
	return err
}

// notingRow is a pgx.Row whose Scan error is noted.
type notingRow struct {
	row pgx.Row
	tx  *attemptTx
}

func (r notingRow) Scan(dest ...interface{}) error { return r.tx.note(r.row.Scan(dest...)) }

var _ pgx.Tx = (*attemptTx)(nil)

// Begin starts a pseudo nested transaction (a savepoint), as pgx's Tx does.
func (t *attemptTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.savepoints++
	sp := &savepointTx{attemptTx: t, name: fmt.Sprintf("idempotency_sp_%d", t.savepoints)}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

// BeginFunc runs f in a savepoint: released when f returns nil, rolled back otherwise.
func (t *attemptTx) BeginFunc(ctx context.Context, f func(pgx.Tx) error) error {
	return beginFunc(ctx, t, f)
}

func beginFunc(ctx context.Context, parent pgx.Tx, f func(pgx.Tx) error) error {
	nested, err := parent.Begin(ctx)
	if err != nil {
		return err
	}
	if err := f(nested); err != nil {
		_ = nested.Rollback(ctx)
		return err
	}
	return nested.Commit(ctx)
}

// Commit is refused: see ErrAttemptOwnsTransaction.
func (t *attemptTx) Commit(ctx context.Context) error { return ErrAttemptOwnsTransaction }

// Rollback is refused: see ErrAttemptOwnsTransaction.
func (t *attemptTx) Rollback(ctx context.Context) error { return ErrAttemptOwnsTransaction }

// CopyFrom runs COPY FROM STDIN in the transaction.
func (t *attemptTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string,
	source pgx.CopyFromSource) (int64, error) {
	n, err := t.conn.CopyFrom(ctx, table, columns, source)
	return n, t.note(err)
}

// SendBatch sends a batch in the transaction.
func (t *attemptTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects needs pgx's own Tx, whose type pgx does not export: it is made by
// sending BEGIN inside the open transaction (one more round trip and a server
// WARNING "there is already a transaction in progress"; nothing else changes).
// Do not call Commit or Rollback on the returned value's transaction.
func (t *attemptTx) LargeObjects() pgx.LargeObjects {
	inner, err := t.conn.Begin(context.Background())
	if err != nil {
		panic(fmt.Sprintf("idempotency: LargeObjects: %v", err))
	}
	return inner.LargeObjects()
}

// Prepare prepares a statement on the connection.
func (t *attemptTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription,
	error) {
	return t.conn.Prepare(ctx, name, sql)
}

// Exec runs a statement in the transaction.
func (t *attemptTx) Exec(ctx context.Context, sql string, args ...interface{}) (pgconn.CommandTag,
	error) {
	tag, err := t.conn.Exec(ctx, sql, args...)
	return tag, t.note(err)
}

// Query runs a query in the transaction.
func (t *attemptTx) Query(ctx context.Context, sql string, args ...interface{}) (pgx.Rows, error) {
	rows, err := t.conn.Query(ctx, sql, args...)
	return rows, t.note(err)
}

// QueryRow runs a query that returns at most one row in the transaction.
func (t *attemptTx) QueryRow(ctx context.Context, sql string, args ...interface{}) pgx.Row {
	return notingRow{row: t.conn.QueryRow(ctx, sql, args...), tx: t}
}

// QueryFunc runs a query and calls f for every row.
func (t *attemptTx) QueryFunc(ctx context.Context, sql string, args []interface{},
	scans []interface{},
	f func(pgx.QueryFuncRow) error) (pgconn.CommandTag, error) {
	tag, err := t.conn.QueryFunc(ctx, sql, args, scans, f)
	return tag, t.note(err)
}

// Conn is the connection the transaction runs on.
func (t *attemptTx) Conn() *pgx.Conn { return t.conn }

// savepointTx is a pseudo nested transaction inside an attempt.
type savepointTx struct {
	*attemptTx
	name   string
	closed bool
}

// Begin starts a savepoint nested in this one.
func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) { return s.attemptTx.Begin(ctx) }

// BeginFunc runs f in a nested savepoint.
func (s *savepointTx) BeginFunc(ctx context.Context, f func(pgx.Tx) error) error {
	return beginFunc(ctx, s, f)
}

// Commit releases the savepoint.
func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.conn.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

// Rollback rolls back to the savepoint.
func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}
