package idempotency

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements that end a started transaction (transactional.go decides which)
// and the helpers that send them: the wire under the runners.
const (
	// One statement for both protocols (0.6.0): without a fence ($8 NULL) it completes
	// the key begin started in this transaction, with one the lease's key.
	completeSQL = "SELECT idempotency.complete($1, $2, status => $3::integer, body => $4::bytea," +
		" headers => $5::jsonb, resource_id => $6::text, one_time_secret => $7::boolean," +
		" fence => $8::bigint)"
	saveFinalSQL = "SELECT idempotency.save_final($1, $2, $3," +
		" idempotency.fingerprint($4, $5, $6::bytea, $7::text[]), status => $8::integer," +
		" body => $9::bytea, headers => $10::jsonb, ttl => $11::interval," +
		" one_time_secret => $12::boolean)"
	// The stored row's expiry (after save_final, and a lease's late completion).
	storedExpirySQL = "SELECT floor(extract(epoch FROM expires_at))::bigint" +
		" FROM idempotency.lookup($1, $2)"
)

// completeArgs are completeSQL's arguments that store response with the kept
// headers (fence: nil in the transactional protocol).
func completeArgs(principal, key string, response Response, kept []string, fence any) []any {
	var resourceID any
	if response.ResourceID != "" {
		resourceID = response.ResourceID
	}
	return []any{principal, key, response.Status, nonNil(response.Body),
		keptHeadersJSON(response, kept), resourceID, response.OneTimeSecret, fence}
}

// stamped adds the key's expiry header (when known), replacing any value the
// handler set, so it appears once.
func stamped(response Response, expires *int64) Response {
	if expires != nil {
		response.Headers.Set(ExpiresHeader, HTTPDate(*expires))
	}
	return response
}

// errCommitRolledBack: COMMIT answered ROLLBACK (the handler left the
// transaction aborted); nothing was stored.
var errCommitRolledBack = errors.New("idempotency: commit rolled back (the transaction had failed)")

// noRowIsNil is err, but nil for pgx.ErrNoRows (a lookup that found no row).
func noRowIsNil(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

// runBatch sends a batch, reads every result (running the callbacks queued
// with its statements) and leaves the connection idle.
func runBatch(ctx context.Context, conn *pgx.Conn, batch *pgx.Batch) error {
	err := conn.SendBatch(ctx, batch).Close()
	rollbackQuietly(ctx, conn)
	return err
}

// rollbackQuietly leaves the connection idle; when that fails the connection
// is gone and the server rolls back.
func rollbackQuietly(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	_, _ = conn.Exec(ctx, "ROLLBACK")
}

// beginCommand is the BEGIN statement for the transaction options, as pgx writes it.
func beginCommand(options pgx.TxOptions) string {
	var b strings.Builder
	b.WriteString("BEGIN")
	if options.IsoLevel != "" {
		b.WriteString(" ISOLATION LEVEL " + string(options.IsoLevel))
	}
	if options.AccessMode != "" {
		b.WriteString(" " + string(options.AccessMode))
	}
	if options.DeferrableMode != "" {
		b.WriteString(" " + string(options.DeferrableMode))
	}
	return b.String()
}

// serverMessage is the primary message of a server error.
func serverMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return err.Error()
}
