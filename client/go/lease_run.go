package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Running an effect under a lease: acquire (with the answer of an outcome that
// does not run it), the effect with its renewals, the settling by the policy.

func (r *LeaseRunner) problem(p Problem, detail string) Response {
	return ProblemResponse(p, detail, r.options.ProblemTypeBase)
}

// Run acquires the key, runs effect while renewing the lease, and settles the
// key by the policy; every statement that settles it is fenced. An error of
// the effect is returned after the key was settled (Once: marked done; the
// other policies: released).
func (r *LeaseRunner) Run(ctx context.Context, req Request, effect Effect) (LeaseResult, error) {
	options := r.options
	if !validKey(req.Key, options.MaxKeyLength) {
		problem := ProblemKeyMalformed
		if req.Key == "" {
			problem = ProblemKeyMissing
		}
		return LeaseResult{Outcome: Rejected, Response: r.problem(problem, fmt.Sprintf(
			"An Idempotency-Key of 1 to %d visible ASCII characters is required.",
			options.MaxKeyLength))}, nil
	}
	if options.Policy == Remember {
		if err := r.final.load(ctx, r.pool); err != nil { // known before holding anything
			return LeaseResult{}, err
		}
	}
	route, err := Options{TTL: options.TTL, Wait: options.Wait}.route(req.Route)
	if err != nil {
		return LeaseResult{}, err
	}
	var outcome string
	var fence *int64 // NULL for a transaction's hold and for expired
	var row answerRow
	err = r.pool.QueryRow(ctx, acquireSQL, req.Principal, req.Key, req.ActionName(), req.Method,
		req.Path, req.Body, excludeArg(req.Exclude), interval(options.Lease), interval(route.TTL),
		route.Wait.arg(), options.ProblemTypeBase, DefaultRetryAfterSeconds).Scan(&outcome, &fence,
		&row.resourceID, &row.expiresEpoch, &row.status, &row.headers, &row.body)
	if sqlState(err) == stateKeyRefused {
		return LeaseResult{Outcome: Rejected, Response: r.problem(ProblemKeyMalformed,
			"The Idempotency-Key was refused by the server.")}, nil
	}
	if err != nil {
		return LeaseResult{}, err
	}
	if outcome != "started" {
		return r.answer(outcome, row), nil
	}
	if fence == nil {
		return LeaseResult{}, errors.New("idempotency: acquire started without a fence")
	}
	return r.runHeld(ctx, req, *fence, row.expiresEpoch, effect)
}

// detailAlreadyProcessed answers a duplicate under the policies Once and
// CommitOnSuccess, whose results are not kept (idempotency.http_answer would replay).
const detailAlreadyProcessed = "A request with this Idempotency-Key was already processed; " +
	"its result is not kept."

// answer maps an outcome that does not run the effect: idempotency.http_answer's
// answer, but for a duplicate under a policy that keeps nothing; with the key's expiry.
func (r *LeaseRunner) answer(outcome string, row answerRow) LeaseResult {
	result := LeaseResult{Outcome: leaseOutcomes[outcome], Response: row.response(),
		ExpiresEpoch: row.expiresEpoch}
	if result.Outcome == Replayed && r.options.Policy != Remember {
		response := r.problem(ProblemAlreadyProcessed, detailAlreadyProcessed)
		result.Outcome, result.Response = Duplicate, stamped(response, row.expiresEpoch)
	}
	return result
}

// leaseOutcomes name acquire's outcomes that do not run the effect, under Remember.
var leaseOutcomes = map[string]LeaseOutcome{"replay": Replayed, "secret_replay": Replayed,
	"mismatch": Mismatch, "in_progress": InProgress, "expired": Expired}

// runHeld runs the effect under the lease (fence) and settles the key.
func (r *LeaseRunner) runHeld(ctx context.Context, req Request, fence int64, expires *int64,
	effect Effect) (LeaseResult, error) {
	options := r.options
	var renew *renewer
	if !options.NoRenew {
		renew = startRenewer(r.pool, req.Principal, req.Key, fence, options)
	}
	response, failure := effect(ctx)
	lost, renewals := false, 0
	if renew != nil {
		lost, renewals = renew.stop()
	}
	settled, kept, err := r.settle(ctx, req, fence, response, failure)
	if err != nil {
		return LeaseResult{}, err
	}
	if failure != nil {
		return LeaseResult{Fence: fence, Renewals: renewals}, failure
	}
	outcome := Fresh
	if !settled || lost {
		outcome = FreshUnfenced
	}
	if expires, err = r.settledExpiry(ctx, req, settled && kept, expires); err != nil {
		return LeaseResult{}, err
	}
	return LeaseResult{Outcome: outcome, Response: stamped(response, expires), Fence: fence,
		Renewals: renewals, ExpiresEpoch: expires}, nil
}

// settledExpiry is the settled key's expiry: acquire's while it is still ahead,
// read again when the key was completed after it passed (complete then keeps it
// one more ttl from its own now()), nil when no row stays (released, lost).
func (r *LeaseRunner) settledExpiry(ctx context.Context, req Request, kept bool,
	acquired *int64) (*int64, error) {
	if !kept || acquired == nil {
		return nil, nil
	}
	if *acquired > time.Now().Unix() {
		return acquired, nil
	}
	var stored *int64
	err := r.pool.QueryRow(ctx, storedExpirySQL, req.Principal, req.Key).Scan(&stored)
	return stored, noRowIsNil(err)
}

// settle marks the key done, stores the response or releases the key, by the
// policy; false when the fence no longer holds the key. kept is false when it
// released the key (no row stays).
func (r *LeaseRunner) settle(ctx context.Context, req Request, fence int64, response Response,
	failure error) (settled, kept bool, err error) {
	policy, status := r.options.Policy, response.Status
	if failure != nil {
		status = 500 // what Once marks a failed effect done with
	}
	sql, args := releaseSQL, []any{req.Principal, req.Key, fence}
	switch {
	case policy == Once || (policy == CommitOnSuccess && failure == nil && status < 400):
		// Marked done: the status alone, nothing to replay.
		sql, args = completeSQL, []any{req.Principal, req.Key, status, nil, nil, nil, false, fence}
	case policy == Remember && failure == nil && r.final.final(status):
		sql, args = completeSQL, completeArgs(req.Principal, req.Key, response,
			r.options.KeptHeaders, fence)
	}
	err = r.pool.QueryRow(ctx, sql, args...).Scan(&settled)
	return settled, sql != releaseSQL, err
}

// renewer renews a lease from its own goroutine every third of the lease (at
// least every 50 ms) until stopped. renew() answering false means the fence
// lost the key: renewing stops and the lease counts as lost. An error
// (network, restart) is retried at the next tick; after MaxRenewFailures in a
// row renewing stops without declaring the lease lost.
type renewer struct {
	done     chan struct{}
	finished sync.WaitGroup
	lost     bool
	renewals int
}

func startRenewer(pool *pgxpool.Pool, principal, key string, fence int64,
	options LeaseOptions) *renewer {
	period := max(options.Lease/3, 50*time.Millisecond)
	r := &renewer{done: make(chan struct{})}
	r.finished.Go(func() {
		ticker := time.NewTicker(period)
		defer ticker.Stop()
		failures := 0
		for {
			select {
			case <-r.done:
				return
			case <-ticker.C:
			}
			// Not the caller's context: the effect is never cancelled, and its
			// lease is kept for as long as it runs.
			ctx, cancel := context.WithTimeout(context.Background(), options.Lease)
			var held bool
			err := pool.QueryRow(ctx, renewSQL, principal, key, fence, options.Lease).Scan(&held)
			cancel()
			switch {
			case err != nil:
				failures++
				if failures >= options.MaxRenewFailures {
					return
				}
			case held:
				failures = 0
				r.renewals++
			default:
				r.lost = true
				return
			}
		}
	})
	return r
}

// stop ends the renewals and reports whether the lease was lost and how many
// renewals succeeded.
func (r *renewer) stop() (bool, int) {
	close(r.done)
	r.finished.Wait()
	return r.lost, r.renewals
}
