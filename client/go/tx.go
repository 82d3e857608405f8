package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	if t.retryable == nil && Retryable(err) { // none of the three is true of nil
		t.retryable = err
	}
	t.stale = t.stale || IsStalePlacement(err)
	if t.fault == nil && IsDatabaseFault(err) {
		t.fault = err
	}
	return err
}

// notingRow is a pgx.Row whose Scan error is noted.
type notingRow struct {
	row pgx.Row
	tx  *attemptTx
}

// Scan reads the row; its error is noted.
func (r notingRow) Scan(dest ...any) error { return r.tx.note(r.row.Scan(dest...)) }

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

// LargeObjects needs pgx's own Tx, whose type pgx does not export: one is made
// inside the open transaction with a no-op begin query (one more round trip).
// That round trip fails only on a lost connection, which cannot be returned from
// here: then LargeObjects panics with the error (the one panic of the package).
func (t *attemptTx) LargeObjects() pgx.LargeObjects {
	inner, err := t.conn.BeginTx(context.Background(), pgx.TxOptions{BeginQuery: "SELECT 1"})
	if err != nil {
		panic(fmt.Sprintf("idempotency: LargeObjects: %v", t.note(err)))
	}
	return inner.LargeObjects()
}

// Prepare prepares a statement on the connection.
func (t *attemptTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription,
	error) {
	return t.conn.Prepare(ctx, name, sql)
}

// Exec runs a statement in the transaction.
func (t *attemptTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag,
	error) {
	tag, err := t.conn.Exec(ctx, sql, args...)
	return tag, t.note(err)
}

// Query runs a query in the transaction.
func (t *attemptTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.conn.Query(ctx, sql, args...)
	return rows, t.note(err)
}

// QueryRow runs a query that returns at most one row in the transaction.
func (t *attemptTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return notingRow{row: t.conn.QueryRow(ctx, sql, args...), tx: t}
}

// Conn is the connection the transaction runs on.
func (t *attemptTx) Conn() *pgx.Conn { return t.conn }

// savepointTx is a pseudo nested transaction inside an attempt; its Begin (the
// attempt's) starts a savepoint nested in this one.
type savepointTx struct {
	*attemptTx
	name   string
	closed bool
}

// Commit releases the savepoint.
func (s *savepointTx) Commit(ctx context.Context) error { return s.end(ctx, "RELEASE SAVEPOINT ") }

// Rollback rolls back to the savepoint.
func (s *savepointTx) Rollback(ctx context.Context) error {
	return s.end(ctx, "ROLLBACK TO SAVEPOINT ")
}

// end sends command with the savepoint's name, once.
func (s *savepointTx) end(ctx context.Context, command string) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.conn.Exec(ctx, command+s.name)
	return err
}
