package idempotency

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The statements of the lease protocol; each commits on its own.
const (
	// The answer of an outcome that does not run the effect in the same statement,
	// as beginSQL's (transactional.go).
	acquireSQL = "SELECT o.outcome, o.fence, o.resource_id," +
		" floor(extract(epoch FROM o.expires_at))::bigint," +
		" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).status END," +
		" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).headers::text END," +
		" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).body END" +
		" FROM idempotency.acquire($1, $2, $3," +
		" idempotency.fingerprint($4, $5, $6::bytea, $7::text[]), $8::interval, $9::interval," +
		" $10::interval) AS o"
	renewSQL   = "SELECT idempotency.renew($1, $2, $3::bigint, $4::interval)"
	releaseSQL = "SELECT idempotency.release($1, $2, $3::bigint)"
)

// Policy says what happens to the key after the effect ran.
type Policy int

const (
	// Remember stores a final response and replays it; a non-final one or an
	// error releases the key.
	Remember Policy = iota
	// Once is at most once: the key is marked done whether the body succeeded or failed.
	Once
	// CommitOnSuccess marks the key done on success (status below 400); a
	// failure or an error releases it for a retry.
	CommitOnSuccess
)

// LeaseOutcome is how a LeaseRunner.Run call ended.
type LeaseOutcome string

// The outcomes of LeaseRunner.Run.
const (
	// Fresh: the body ran under this call and the key was settled with its fence.
	Fresh LeaseOutcome = "fresh"
	// Replayed: policy Remember, the stored response of an earlier call.
	Replayed LeaseOutcome = "replayed"
	// InProgress: another holder's lease is live (or a transaction holds the key): 409.
	InProgress LeaseOutcome = "in_progress"
	// Duplicate: policies Once and CommitOnSuccess, an earlier call already did it: 409.
	Duplicate LeaseOutcome = "duplicate"
	// Mismatch: the key was used for another request: 422.
	Mismatch LeaseOutcome = "mismatch"
	// FreshUnfenced: the body ran, but the lease was lost meanwhile: nothing was stored.
	FreshUnfenced LeaseOutcome = "fresh_unfenced"
	// Rejected: missing or malformed key: 400.
	Rejected LeaseOutcome = "rejected"
	// Expired: the key expired under an on_expiry 'refuse' policy (a tombstone): 410,
	// the effect did not run.
	Expired LeaseOutcome = "expired"
)

// LeaseOptions are the settings of a LeaseRunner; zero values take the defaults.
type LeaseOptions struct {
	// Policy is Remember unless set.
	Policy Policy
	// Lease is the lease length (30 s), renewed every third of it, at least every 50 ms.
	Lease time.Duration
	// NoRenew turns the renewal goroutine off.
	NoRenew bool
	// MaxRenewFailures: consecutive renewal errors after which renewing stops
	// without declaring the lease lost (3).
	MaxRenewFailures int
	// TTL as in Options (0: the server's idempotency.key_ttl; negative: an error).
	TTL time.Duration
	// Wait as in Options: what acquire does while a transaction holds the key
	// (Wait{}: idempotency.wait_timeout); a live lease is 409 at once in every mode.
	// Request.Route's TTL and Wait override both per call.
	Wait Wait
	// KeptHeaders, FinalStatuses, ProblemTypeBase, MaxKeyLength as in Options.
	KeptHeaders     []string
	FinalStatuses   []int  // as Options.FinalStatuses (nil: ask the server)
	ProblemTypeBase string // as Options.ProblemTypeBase ("": DefaultProblemTypeBase)
	MaxKeyLength    int    // as Options.MaxKeyLength (0: 255)
}

// LeaseResult is the result of one run.
type LeaseResult struct {
	// Outcome is how the run ended (Fresh, Replayed, InProgress, ...).
	Outcome LeaseOutcome
	// Response is what to send: the body's, the stored one, or a problem response.
	Response Response
	// Fence is the fence this call held (0 when it held none).
	Fence int64
	// Renewals counts the successful renewals while the body ran.
	Renewals int
	// ExpiresEpoch is when the key stops counting: its row's expires_at in seconds
	// since the epoch (in the past for Expired); nil when no row backs the answer
	// (rejected, released). Response already carries it as Idempotency-Expires.
	ExpiresEpoch *int64
}

// Effect is the work outside the database. It runs outside any transaction and
// is never cancelled by the runner, not even when the lease is lost.
type Effect func(ctx context.Context) (Response, error)

// LeaseRunner runs external effects under leases. Safe for concurrent use: every
// statement takes a connection from the pool (renewals too).
type LeaseRunner struct {
	pool    *pgxpool.Pool
	options LeaseOptions
	final   *finalStatuses
}

// NewLeaseRunner makes a runner on a pool.
func NewLeaseRunner(pool *pgxpool.Pool, options LeaseOptions) (*LeaseRunner, error) {
	if options.Lease < 0 {
		return nil, errors.New("idempotency: Lease must be positive")
	}
	if options.TTL < 0 {
		return nil, errNegativeTTL
	}
	options.Lease = cmp.Or(options.Lease, 30*time.Second)
	options.MaxRenewFailures = cmp.Or(options.MaxRenewFailures, 3)
	keyed := Options{KeptHeaders: options.KeptHeaders, ProblemTypeBase: options.ProblemTypeBase,
		MaxKeyLength: options.MaxKeyLength}.withDefaults() // the defaults of a Client's
	options.KeptHeaders = keyed.KeptHeaders
	options.ProblemTypeBase = keyed.ProblemTypeBase
	options.MaxKeyLength = keyed.MaxKeyLength
	final, err := newFinalStatuses(options.FinalStatuses)
	if err != nil {
		return nil, err
	}
	return &LeaseRunner{pool: pool, options: options, final: final}, nil
}
