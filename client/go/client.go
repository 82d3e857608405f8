package idempotency

// The Client: its settings (Options), counters and constructor, below the runners
// that use it (transactional.go, batch.go, lease_run.go).

import (
	"cmp"
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
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
	o.MaxAttempts = cmp.Or(o.MaxAttempts, 3)
	o.RetryAfter = cmp.Or(o.RetryAfter, DefaultRetryAfterSeconds)
	o.ProblemTypeBase = cmp.Or(o.ProblemTypeBase, DefaultProblemTypeBase)
	o.MaxKeyLength = cmp.Or(o.MaxKeyLength, 255)
	return o
}

// route is a call's Route over the options: each zero value of r takes o's; a
// negative TTL is refused (errNegativeTTL).
func (o Options) route(r Route) (Route, error) {
	r.TTL = cmp.Or(r.TTL, o.TTL)
	r.Wait = cmp.Or(r.Wait, o.Wait) // the zero Wait is "not set"
	if r.MethodsRequiringKey == nil {
		r.MethodsRequiringKey = o.MethodsRequiringKey
	}
	if r.TTL < 0 {
		return r, errNegativeTTL
	}
	return r, nil
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

// Client runs handlers through the transactional protocol and returns their HTTP
// answers (idempotency.http_answer's for the outcomes that do not run the handler). Safe for concurrent use; a *pgx.Conn is not (pgx's rule): one request
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
