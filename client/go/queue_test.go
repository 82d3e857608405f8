package idempotency

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func jobsTable(t *testing.T) {
	exec1(t, "CREATE TABLE IF NOT EXISTS go_jobs (id bigserial PRIMARY KEY,"+
		" principal text NOT NULL, job text NOT NULL)")
}

func jobs(t *testing.T, who string) int64 {
	return scalarInt(t, "SELECT count(*) FROM go_jobs WHERE principal = $1", who)
}

func keyRows(t *testing.T, who, key string) int64 {
	return scalarInt(t, "SELECT count(*) FROM idempotency.lookup($1, $2)", who, key)
}

// insertJob is an Enqueue that inserts one job row and counts its calls.
func insertJob(who string, calls *int) Enqueue {
	return func(ctx context.Context, tx pgx.Tx) error {
		*calls++
		_, err := tx.Exec(ctx, "INSERT INTO go_jobs (principal, job) VALUES ($1, 'report')", who)
		return err
	}
}

// pushIn runs PushUnique in a transaction of its own on conn, committed (or
// rolled back when rollback is set).
func pushIn(conn *pgx.Conn, who, key string, ttl time.Duration, enqueue Enqueue,
	rollback bool) (bool, error) {
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	pushed, err := PushUnique(ctx, tx, who, key, ttl, enqueue)
	if err != nil || rollback {
		_ = tx.Rollback(ctx)
		return pushed, err
	}
	return pushed, tx.Commit(ctx)
}

// push is pushIn that fails the test on an error.
func push(t *testing.T, conn *pgx.Conn, who, key string, ttl time.Duration, enqueue Enqueue,
	rollback bool) bool {
	t.Helper()
	pushed, err := pushIn(conn, who, key, ttl, enqueue, rollback)
	if err != nil {
		t.Fatalf("PushUnique: %v", err)
	}
	return pushed
}

func TestPushUniqueEnqueuesOncePerWindowAndARollbackFreesTheKey(t *testing.T) {
	jobsTable(t)
	conn, who, calls := connect(t), principal(t), 0
	// Rolled back: no job, no key row; the key can be pushed again.
	if !push(t, conn, who, "job-1", 0, insertJob(who, &calls), true) ||
		jobs(t, who) != 0 || keyRows(t, who, "job-1") != 0 {
		t.Fatalf("a rolled-back push left %d jobs, %d key rows", jobs(t, who),
			keyRows(t, who, "job-1"))
	}
	if !push(t, conn, who, "job-1", 0, insertJob(who, &calls), false) {
		t.Fatal("the push after the rollback did not enqueue")
	}
	if push(t, conn, who, "job-1", 0, insertJob(who, &calls), false) {
		t.Fatal("a second push of the key enqueued again")
	}
	if jobs(t, who) != 1 || calls != 2 {
		t.Fatalf("%d jobs, enqueue ran %d times (want 1, 2: not run when false)", jobs(t, who),
			calls)
	}
	// A short window: the key is pushed again once it has passed.
	if !push(t, conn, who, "job-2", time.Second, insertJob(who, &calls), false) {
		t.Fatal("job-2 not enqueued")
	}
	time.Sleep(1300 * time.Millisecond)
	if !push(t, conn, who, "job-2", time.Second, insertJob(who, &calls), false) ||
		jobs(t, who) != 3 {
		t.Fatalf("job-2 after its window: %d jobs", jobs(t, who))
	}
}

func TestPushUniqueReturnsTheEnqueueErrorAndTheRollbackFreesTheKey(t *testing.T) {
	jobsTable(t)
	ctx, conn, who, calls := context.Background(), connect(t), principal(t), 0
	failed := errors.New("queue full")
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := PushUnique(ctx, tx, who, "job", 0, func(context.Context, pgx.Tx) error {
		return failed
	})
	if pushed || !errors.Is(err, failed) {
		t.Fatalf("pushed %v, err %v; want false and the enqueue error", pushed, err)
	}
	_ = tx.Rollback(ctx)
	if !push(t, conn, who, "job", 0, insertJob(who, &calls), false) || jobs(t, who) != 1 {
		t.Fatal("the key was not free after the failed push rolled back")
	}
}

// TestPushUniqueConcurrentPushesOneTrue: pushes of one key from several
// transactions at once: the later ones wait for the first; exactly one
// enqueues when it commits, and a waiter takes the key when it rolls back.
func TestPushUniqueConcurrentPushesOneTrue(t *testing.T) {
	jobsTable(t)
	for _, firstCommits := range []bool{true, false} {
		ctx, who := context.Background(), principal(t)
		holder := connect(t)
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var holderCalls int
		first, err := PushUnique(ctx, tx, who, "job", 0, insertJob(who, &holderCalls))
		if err != nil || !first {
			t.Fatalf("first push: %v, %v", first, err)
		}
		const waiters = 3
		results, errs := make(chan bool, waiters), make(chan error, waiters)
		var wg sync.WaitGroup
		for i := 0; i < waiters; i++ {
			wg.Add(1)
			go func(conn *pgx.Conn) {
				defer wg.Done()
				var calls int
				pushed, err := pushIn(conn, who, "job", 0, insertJob(who, &calls), false)
				results <- pushed
				errs <- err
			}(connect(t))
		}
		time.Sleep(300 * time.Millisecond)
		if len(results) != 0 {
			t.Fatal("a push did not wait for the transaction that holds the key")
		}
		if firstCommits {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(results)
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("a concurrent push: %v", err)
			}
		}
		trues := 0
		for pushed := range results {
			if pushed {
				trues++
			}
		}
		if firstCommits {
			trues++
		}
		if trues != 1 || jobs(t, who) != 1 {
			t.Fatalf("first commits %v: %d pushes true, %d jobs; want exactly 1 and 1",
				firstCommits, trues, jobs(t, who))
		}
	}
}
