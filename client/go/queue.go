package idempotency

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// pushUniqueSQL claims the key with idempotency.claim (a completed row, action
// "claim"); the ttl is the window in which the key counts.
const pushUniqueSQL = "SELECT idempotency.claim($1, $2, $3::interval)"

// Enqueue inserts the job row (or does whatever must happen at most once per
// window) in the transaction that claimed the key.
type Enqueue func(ctx context.Context, tx pgx.Tx) error

// PushUnique enqueues a job at most once per window, inside the caller's
// transaction tx: it claims (principal, key) for ttl (0: idempotency.key_ttl)
// and, only when this call claimed it, runs enqueue in the same transaction.
// It returns true when this call enqueued the job, false (enqueue not run)
// when the key was claimed before within the window.
//
// The key row and the job row commit or roll back together with tx: a push
// whose transaction rolls back enqueued nothing and leaves the key free. A
// concurrent push of the same key waits for tx (up to idempotency.wait_timeout,
// then 55P03) and gets false if tx commits, true if it rolls back. An error of
// enqueue is returned as it is; tx is then aborted: roll it back.
func PushUnique(ctx context.Context, tx pgx.Tx, principal, key string, ttl time.Duration,
	enqueue Enqueue) (bool, error) {
	var claimed bool
	err := tx.QueryRow(ctx, pushUniqueSQL, principal, key, interval(ttl)).Scan(&claimed)
	if err != nil || !claimed {
		return false, err // an error, or the key was claimed before within the window
	}
	err = enqueue(ctx, tx)
	return err == nil, err
}
