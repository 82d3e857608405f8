package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of the transactional protocol. The fingerprint is computed by
// the server in the same statement, so the client needs no RFC 8785 code.
const (
	// http_answer answers in the same statement every outcome but "started": OFFSET 0
	// keeps the subquery from being pulled up, so the qual on the outer row is a
	// one-time filter over the function scan (no call for started), not a join filter.
	beginSQL = "SELECT o.outcome, o.resource_id, floor(extract(epoch FROM o.expires_at))::bigint," +
		" a.status, a.headers::text, a.body" +
		" FROM idempotency.begin($1, $2, $3," +
		" idempotency.fingerprint($4, $5, $6::bytea, $7::text[]), $8::interval, $9::interval) AS o" +
		" LEFT JOIN LATERAL (SELECT * FROM idempotency.http_answer(o, $10::text, $11::integer)" +
		" WHERE o.outcome <> 'started' OFFSET 0) AS a ON true"
	// Named arguments: the same call works on 0.5.0 (two complete overloads) and 0.6.0.
	completeSQL = "SELECT idempotency.complete($1, $2, status => $3::integer, body => $4::bytea," +
		" headers => $5::jsonb, resource_id => $6::text, one_time_secret => $7::boolean)"
	saveFinalSQL = "SELECT idempotency.save_final($1, $2, $3," +
		" idempotency.fingerprint($4, $5, $6::bytea, $7::text[]), status => $8::integer," +
		" body => $9::bytea, headers => $10::jsonb, ttl => $11::interval," +
		" one_time_secret => $12::boolean)"
)

// Options are the settings of a Client; the zero value of a field takes the
// default named beside it. TTL, Wait and MethodsRequiringKey can be set per route
// or per call (Route, Request.Route, MiddlewareOptions.Route).
type Options struct {
	// MethodsRequiringKey are answered 400 without an Idempotency-Key (nil: POST,
	// PATCH; an empty, non-nil list: none).
	MethodsRequiringKey []string
	// KeptHeaders are stored with the key and replayed (DefaultKeptHeaders).
	KeptHeaders []string
	// Wait is what a duplicate of a running request does: WaitUpTo(d) waits up to
	// d for the transaction that holds the key, then replays its response or
	// answers 409; Reject answers 409 with Retry-After at once. Wait{} (unset)
	// and WaitServer wait up to the server's idempotency.wait_timeout.
	Wait Wait
	// TTL is the key's lifetime (0: the server's idempotency.key_ttl; negative:
	// NewClient fails).
	TTL time.Duration
	// MaxAttempts bounds the runs of Handle on serialization failures and deadlocks (3).
	MaxAttempts int
	// RetryAfter is the Retry-After, in seconds, of a 409 for a key held by a transaction (1).
	RetryAfter int
	// FinalStatuses are the statuses that are stored; nil: ask the server once.
	FinalStatuses []int
	// ProblemTypeBase prefixes problem type URIs (DefaultProblemTypeBase).
	ProblemTypeBase string
	// MaxKeyLength is the longest key accepted before asking the server (255).
	MaxKeyLength int
	// TxOptions are the isolation level, access mode and deferrable mode of the transaction.
	TxOptions pgx.TxOptions
}

func (o Options) withDefaults() Options {
	if o.MethodsRequiringKey == nil {
		o.MethodsRequiringKey = []string{"POST", "PATCH"}
	}
	if o.KeptHeaders == nil {
		o.KeptHeaders = DefaultKeptHeaders
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = 3
	}
	if o.RetryAfter == 0 {
		o.RetryAfter = DefaultRetryAfterSeconds
	}
	if o.ProblemTypeBase == "" {
		o.ProblemTypeBase = DefaultProblemTypeBase
	}
	if o.MaxKeyLength == 0 {
		o.MaxKeyLength = 255
	}
	return o
}

// route is a call's Route over the options: each zero value of r takes o's.
func (o Options) route(r Route) Route {
	if r.TTL == 0 {
		r.TTL = o.TTL
	}
	r.Wait = r.Wait.or(o.Wait)
	if r.MethodsRequiringKey == nil {
		r.MethodsRequiringKey = o.MethodsRequiringKey
	}
	return r
}

// Counters say what a Client did, for metrics.
type Counters struct {
	// Started, Replayed, Mismatched, InProgress, SecretReplayed count begin's
	// outcomes (the handler ran; stored response; 422; 409; one-time secret 409).
	Started, Replayed, Mismatched, InProgress, SecretReplayed int64
	// RejectedKeys counts 400s for keys; NotStored non-final answers; StoredErrors
	// final errors stored by save_final; Retries reruns on 40001 and 40P01.
	RejectedKeys, NotStored, StoredErrors, Retries int64
	// Expired counts retries of keys that expired under an on_expiry 'refuse' policy (410).
	Expired int64
}

// Handler is the application's work. It runs inside the transaction that holds
// the key and must do its writes through tx; it must not commit or roll back.
// Its response is stored when it is final; an error rolls back and stores nothing.
type Handler func(ctx context.Context, tx pgx.Tx) (Response, error)

// Client runs handlers through the transactional protocol and maps outcomes to
// HTTP. Safe for concurrent use; a *pgx.Conn is not (pgx's rule): one request
// per connection at a time.
type Client struct {
	options  Options
	final    *finalStatuses
	counters Counters
}

// NewClient makes a client; it fails only on an invalid FinalStatuses list.
func NewClient(options Options) (*Client, error) {
	options = options.withDefaults()
	if options.MaxAttempts < 1 {
		return nil, errors.New("idempotency: MaxAttempts must be at least 1")
	}
	if options.TTL < 0 {
		return nil, errNegativeTTL
	}
	final, err := newFinalStatuses(options.FinalStatuses)
	if err != nil {
		return nil, err
	}
	return &Client{options: options, final: final}, nil
}

// Options are the client's settings, defaults filled in.
func (c *Client) Options() Options { return c.options }

// Counters is a snapshot of the client's counters.
func (c *Client) Counters() Counters {
	n := &c.counters
	return Counters{
		Started: atomic.LoadInt64(&n.Started), Replayed: atomic.LoadInt64(&n.Replayed),
		Mismatched: atomic.LoadInt64(&n.Mismatched), InProgress: atomic.LoadInt64(&n.InProgress),
		SecretReplayed: atomic.LoadInt64(&n.SecretReplayed),
		RejectedKeys:   atomic.LoadInt64(&n.RejectedKeys),
		NotStored:      atomic.LoadInt64(&n.NotStored),
		StoredErrors:   atomic.LoadInt64(&n.StoredErrors), Retries: atomic.LoadInt64(&n.Retries),
		Expired: atomic.LoadInt64(&n.Expired),
	}
}

func (c *Client) problem(p Problem, detail string) Response {
	return ProblemResponse(p, detail, c.options.ProblemTypeBase)
}

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
	route := c.options.route(req.Route)
	if err := route.check(); err != nil {
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
	outcome, row, answer, err := c.begin(ctx, conn, req, route)
	if err != nil || answer != nil {
		return answerOrZero(answer), err
	}
	if outcome != "started" {
		return c.answer(ctx, conn, outcome, row)
	}
	atomic.AddInt64(&c.counters.Started, 1)
	tx := &attemptTx{conn: conn, expires: row.expiresEpoch}
	response, err := handler(ctx, tx)
	if err == nil && tx.retryable != nil {
		err = tx.retryable // rerun by Handle with a fresh response
	}
	if err == nil && tx.fault != nil {
		err = tx.fault // the handler answered for itself (its own 500): the fault is the answer
	}
	if err != nil {
		rollbackQuietly(ctx, conn) // nothing is stored; the error is the caller's
		return Response{}, err
	}
	return c.settle(ctx, conn, req, route.TTL, response, row.expiresEpoch)
}

func answerOrZero(r *Response) Response {
	if r == nil {
		return Response{}
	}
	return *r
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
// answer of an outcome that does not run the handler comes in the same row. A
// key the server refuses or a body it cannot fingerprint comes back as an answer.
func (c *Client) begin(ctx context.Context, conn *pgx.Conn, req Request, route Route) (
	string, answerRow, *Response, error) {
	batch := &pgx.Batch{}
	batch.Queue(beginCommand(c.options.TxOptions))
	batch.Queue(beginSQL, req.Principal, req.Key, req.ActionName(), req.Method, req.Path, req.Body,
		excludeArg(req.Exclude), interval(route.TTL), route.Wait.arg(), c.options.ProblemTypeBase,
		c.options.RetryAfter)
	results := conn.SendBatch(ctx, batch)
	var outcome string
	var row answerRow
	_, err := results.Exec()
	if err == nil {
		err = results.QueryRow().Scan(&outcome, &row.resourceID, &row.expiresEpoch, &row.status,
			&row.headers, &row.body)
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		return outcome, row, nil, nil
	}
	rollbackQuietly(ctx, conn)
	switch sqlState(err) {
	case stateKeyRefused:
		atomic.AddInt64(&c.counters.RejectedKeys, 1)
		answer := c.problem(ProblemKeyMalformed, "The Idempotency-Key was refused by the server.")
		return "", row, &answer, nil
	case stateBodyTooDeep, stateBodyTooDeep2:
		answer := c.problem(ProblemBodyInvalid, serverMessage(err))
		return "", row, &answer, nil
	}
	return "", row, nil, err
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

// count adds an outcome that does not run the handler to the counters (Handle's
// answers and BeginBatch's alike).
func (c *Client) count(outcome string) {
	switch outcome {
	case "replay":
		atomic.AddInt64(&c.counters.Replayed, 1)
	case "mismatch":
		atomic.AddInt64(&c.counters.Mismatched, 1)
	case "in_progress":
		atomic.AddInt64(&c.counters.InProgress, 1)
	case "secret_replay":
		atomic.AddInt64(&c.counters.SecretReplayed, 1)
	case "expired":
		atomic.AddInt64(&c.counters.Expired, 1)
	}
}
