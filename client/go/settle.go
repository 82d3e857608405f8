package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// settle ends a started attempt by what the handler answered: a final success
// is completed and committed (one batch), a final error is rolled back and then
// stored alone by save_final (one batch), anything else (401, 429, 3xx, 5xx) is
// rolled back and not stored, so a retry takes effect once.
func (c *Client) settle(ctx context.Context, conn *pgx.Conn, req Request, ttl time.Duration,
	response Response, expires *int64) (Response, error) {
	if response.Status < 100 || response.Status > 599 {
		rollbackQuietly(ctx, conn)
		return Response{}, fmt.Errorf("idempotency: handler returned HTTP status %d",
			response.Status)
	}
	if !c.final.final(response.Status) {
		atomic.AddInt64(&c.counters.NotStored, 1)
		rollbackQuietly(ctx, conn)
		return response, nil
	}
	headers := keptHeadersJSON(response, c.options.KeptHeaders)
	batch := &pgx.Batch{}
	if response.Status >= 400 {
		// A final error has no effect to keep: roll back, then store it alone
		// (save_final runs in an implicit transaction of its own, same flight).
		// A one-time secret is sent without body and headers: the server would
		// drop them anyway.
		body, kept := response.Body, any(headers)
		if response.OneTimeSecret {
			body, kept = []byte{}, nil
		}
		batch.Queue("ROLLBACK")
		batch.Queue(saveFinalSQL, req.Principal, req.Key, req.ActionName(), req.Method, req.Path,
			req.Body, excludeArg(req.Exclude), response.Status, body, kept, interval(ttl),
			response.OneTimeSecret)
		// The stored row's expiry, same flight: save_final starts the ttl at its own now().
		batch.Queue(storedExpirySQL, req.Principal, req.Key)
		stored, err := runSaveBatch(ctx, conn, batch)
		if err != nil {
			return Response{}, err
		}
		atomic.AddInt64(&c.counters.StoredErrors, 1)
		return stamped(response, stored), nil
	}
	var resourceID any
	if response.ResourceID != "" {
		resourceID = response.ResourceID
	}
	batch.Queue(completeSQL, req.Principal, req.Key, response.Status, nonNil(response.Body),
		headers,
		resourceID, response.OneTimeSecret)
	batch.Queue("COMMIT")
	if err := runBatch(ctx, conn, batch, "COMMIT"); err != nil {
		return Response{}, err
	}
	return stamped(response, expires), nil
}

const storedExpirySQL = "SELECT floor(extract(epoch FROM expires_at))::bigint" +
	" FROM idempotency.lookup($1, $2)"

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

// runBatch sends a batch, reads every result and leaves the connection idle.
// When lastTag is set, the last statement must have answered it (COMMIT, not ROLLBACK).
func runBatch(ctx context.Context, conn *pgx.Conn, batch *pgx.Batch, lastTag string) error {
	results := conn.SendBatch(ctx, batch)
	var err error
	var tag pgconn.CommandTag
	for i := 0; i < batch.Len() && err == nil; i++ {
		tag, err = results.Exec()
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	if err == nil && lastTag != "" && tag.String() != lastTag {
		err = errCommitRolledBack
	}
	rollbackQuietly(ctx, conn)
	return err
}

// runSaveBatch sends ROLLBACK, save_final and the expiry lookup, and returns
// the stored row's expiry (nil when there is no row).
func runSaveBatch(ctx context.Context, conn *pgx.Conn, batch *pgx.Batch) (*int64, error) {
	results := conn.SendBatch(ctx, batch)
	var stored *int64
	_, err := results.Exec()
	if err == nil {
		_, err = results.Exec()
	}
	if err == nil {
		err = results.QueryRow().Scan(&stored)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	rollbackQuietly(ctx, conn)
	return stored, err
}

func nonNil(body []byte) []byte {
	if body == nil {
		return []byte{}
	}
	return body
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
