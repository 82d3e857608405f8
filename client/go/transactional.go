package idempotency

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The first statement of the transactional protocol (the others: wire.go). The
// fingerprint is computed by the server in the same statement, so the client needs
// no RFC 8785 code.
const (
	// http_answer answers every outcome but "started" (CASE: no call then), in the one
	// form Citus delegates: SELECT ... FROM f(...), nothing else in FROM or WHERE.
	beginSQL = "SELECT o.outcome, o.resource_id, floor(extract(epoch FROM o.expires_at))::bigint," +
		" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).status END," +
		" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).headers::text END," +
		" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).body END" +
		" FROM idempotency.begin($1, $2, $3," +
		" idempotency.fingerprint($4, $5, $6::bytea, $7::text[]), $8::interval, $9::interval) AS o"
)

// Handle runs handler through the protocol on conn, which must be idle (not in
// a transaction), and returns the response to send. The round trips are those
// of a plain transaction: BEGIN travels with idempotency.begin in one batch,
// idempotency.complete with COMMIT. Serialization failures (40001) and
// deadlocks (40P01) rerun the whole attempt, handler included, with a fresh
// response, up to MaxAttempts; then the error is returned (map it to 503). A
// commit whose outcome is unknown (a lost connection) is never retried.
func (c *Client) Handle(ctx context.Context, conn *pgx.Conn, req Request,
	handler Handler) (Response, error) {
	for attempt := 1; ; attempt++ {
		response, err := c.attempt(ctx, conn, req, handler)
		if err == nil || !Retryable(err) || attempt >= c.options.MaxAttempts {
			return response, err
		}
		atomic.AddInt64(&c.counters.Retries, 1)
	}
}

// attempt is one pass: check the key, begin, the handler, settle.
func (c *Client) attempt(ctx context.Context, conn *pgx.Conn, req Request,
	handler Handler) (Response, error) {
	if status := conn.PgConn().TxStatus(); status != 'I' {
		return Response{}, fmt.Errorf("idempotency: the connection must be idle (status %q): "+
			"the attempt opens and ends its own transaction", status)
	}
	route, err := c.options.route(req.Route)
	if err != nil {
		return Response{}, err
	}
	method := strings.ToUpper(req.Method)
	if req.Key == "" {
		if !route.requiresKey(method) {
			return c.unkeyed(ctx, conn, handler)
		}
		atomic.AddInt64(&c.counters.RejectedKeys, 1)
		return c.problem(ProblemKeyMissing, method+" requests need an Idempotency-Key header."), nil
	}
	if !validKey(req.Key, c.options.MaxKeyLength) {
		atomic.AddInt64(&c.counters.RejectedKeys, 1)
		return c.problem(ProblemKeyMalformed, fmt.Sprintf(
			"The Idempotency-Key must be 1 to %d visible ASCII characters.",
			c.options.MaxKeyLength)), nil
	}
	if err := c.final.load(ctx, conn); err != nil { // known before any transaction starts
		return Response{}, err
	}
	outcome, row, err := c.begin(ctx, conn, req, route)
	if answer, refused := c.refusal(err); refused {
		return answer, nil
	}
	if err != nil {
		return Response{}, err
	}
	if outcome != "started" {
		return c.answer(ctx, conn, outcome, row)
	}
	atomic.AddInt64(&c.counters.Started, 1)
	tx := &attemptTx{conn: conn, expires: row.expiresEpoch}
	response, err := handler(ctx, tx)
	// A noted serialization failure or deadlock is rerun by Handle with a fresh
	// response; a noted fault is the answer even when the handler answered for
	// itself (its own 500).
	err = cmp.Or(err, tx.retryable, tx.fault)
	if err != nil {
		rollbackQuietly(ctx, conn) // nothing is stored; the error is the caller's
		return Response{}, err
	}
	return c.settle(ctx, conn, req, route.TTL, response, row.expiresEpoch)
}

// unkeyed runs a request that needs no key in a plain transaction; nothing is stored.
func (c *Client) unkeyed(ctx context.Context, conn *pgx.Conn, handler Handler) (Response, error) {
	tx, err := conn.BeginTx(ctx, c.options.TxOptions)
	if err != nil {
		return Response{}, err
	}
	response, err := handler(ctx, tx)
	if err != nil {
		_ = tx.Rollback(ctx)
		return Response{}, err
	}
	return response, tx.Commit(ctx)
}

// begin sends BEGIN and idempotency.begin in one batch (one round trip); the
// answer of an outcome that does not run the handler comes in the same row. On
// an error the transaction is rolled back (see refusal).
func (c *Client) begin(ctx context.Context, conn *pgx.Conn, req Request, route Route) (
	string, answerRow, error) {
	var outcome string
	var row answerRow
	batch := &pgx.Batch{}
	batch.Queue(beginCommand(c.options.TxOptions))
	batch.Queue(beginSQL, req.Principal, req.Key, req.ActionName(), req.Method, req.Path, req.Body,
		excludeArg(req.Exclude), interval(route.TTL), route.Wait.arg(), c.options.ProblemTypeBase,
		c.options.RetryAfter).QueryRow(func(r pgx.Row) error {
		return r.Scan(&outcome, &row.resourceID, &row.expiresEpoch, &row.status, &row.headers,
			&row.body)
	})
	err := conn.SendBatch(ctx, batch).Close()
	if err != nil {
		rollbackQuietly(ctx, conn)
	}
	return outcome, row, err
}

// refusal is the answer to begin's error when it is a key the server refused or
// a body it cannot fingerprint; false for any other error.
func (c *Client) refusal(err error) (Response, bool) {
	switch sqlState(err) {
	case stateKeyRefused:
		atomic.AddInt64(&c.counters.RejectedKeys, 1)
		return c.problem(ProblemKeyMalformed, "The Idempotency-Key was refused by the server."), true
	case stateBodyTooDeep, stateBodyTooDeep2:
		return c.problem(ProblemBodyInvalid, serverMessage(err)), true
	}
	return Response{}, false
}

// answer ends the transaction of an outcome that does not run the handler; its
// answer is idempotency.http_answer's, from begin's row.
func (c *Client) answer(ctx context.Context, conn *pgx.Conn, outcome string, row answerRow) (
	Response, error) {
	c.count(outcome)
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return Response{}, err
	}
	return row.response(), nil
}

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
	batch := &pgx.Batch{}
	if response.Status >= 400 {
		// A final error has no effect to keep: roll back, then store it alone
		// (save_final runs in an implicit transaction of its own, same flight).
		// A one-time secret is sent without body and headers: the server would
		// drop them anyway.
		body, kept := response.Body, any(keptHeadersJSON(response, c.options.KeptHeaders))
		if response.OneTimeSecret {
			body, kept = []byte{}, nil
		}
		batch.Queue("ROLLBACK")
		batch.Queue(saveFinalSQL, req.Principal, req.Key, req.ActionName(), req.Method, req.Path,
			req.Body, excludeArg(req.Exclude), response.Status, body, kept, interval(ttl),
			response.OneTimeSecret)
		// The stored row's expiry, same flight: save_final starts the ttl at its own now().
		var stored *int64 // nil when there is no row
		batch.Queue(storedExpirySQL, req.Principal, req.Key).QueryRow(func(row pgx.Row) error {
			return noRowIsNil(row.Scan(&stored))
		})
		if err := runBatch(ctx, conn, batch); err != nil {
			return Response{}, err
		}
		atomic.AddInt64(&c.counters.StoredErrors, 1)
		return stamped(response, stored), nil
	}
	batch.Queue(completeSQL, completeArgs(req.Principal, req.Key, response, c.options.KeptHeaders,
		nil)...)
	batch.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() != "COMMIT" { // ROLLBACK: the handler left the transaction aborted
			return errCommitRolledBack
		}
		return nil
	})
	if err := runBatch(ctx, conn, batch); err != nil {
		return Response{}, err
	}
	return stamped(response, expires), nil
}
