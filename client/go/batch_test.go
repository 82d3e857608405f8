package idempotency

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// These tests need the extension's batch functions (0.8.0): against an older
// extension they fail with 42883 (function does not exist); they never skip.

// batchKeys are the keys of a list of outcomes, in order, with their ords.
func batchKeys(outcomes []BatchOutcome) string {
	parts := make([]string, len(outcomes))
	for i, o := range outcomes {
		parts[i] = fmt.Sprintf("%d:%s:%s", o.Ord, o.Key, o.Outcome)
	}
	return strings.Join(parts, " ")
}

func TestBeginBatchOutcomesPerKeyThenCompleteBatch(t *testing.T) {
	ordersTable(t)
	ctx, who, conn := context.Background(), principal(t), connect(t)
	client := newClient(t, Options{Wait: Reject})
	// done: completed with the same body (replay); other: another body (mismatch);
	// held: held by an open transaction (in_progress at once in reject mode).
	for _, key := range []string{"done", "other"} {
		if _, err := client.Handle(ctx, conn, orderRequest(who, key, order),
			createOrder(who, 201, new(int))); err != nil {
			t.Fatal(err)
		}
	}
	holder := connect(t)
	holderTx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holderTx.Rollback(ctx) }()
	if _, err := holderTx.Exec(ctx, "SELECT * FROM idempotency.begin($1, 'held', 'POST /orders',"+
		" idempotency.fingerprint('POST', '/orders'))", who); err != nil {
		t.Fatal(err)
	}
	reqs := []Request{orderRequest(who, "new-1", order), orderRequest(who, "done", orderRespelled),
		orderRequest(who, "other", `{"item":"pen"}`), orderRequest(who, "held", order),
		orderRequest(who, "new-2", order)}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	began := time.Now()
	outcomes, err := client.BeginBatch(ctx, tx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(began); waited > 2*time.Second {
		t.Fatalf("reject mode waited %v for the held key", waited)
	}
	want := "1:new-1:started 2:done:replay 3:other:mismatch 4:held:in_progress 5:new-2:started"
	if got := batchKeys(outcomes); got != want {
		t.Fatalf("outcomes %s, want %s", got, want)
	}
	replay, mismatch, busy := outcomes[1].Response, outcomes[2].Response, outcomes[3].Response
	if outcomes[0].Response != nil || replay == nil || replay.Status != 201 || !replay.Replayed ||
		string(replay.Body) != `{"id":1}` || outcomes[1].Status != 201 ||
		outcomes[1].ResourceID != "1" || outcomes[1].ExpiresAt.IsZero() {
		t.Fatalf("replay %+v (outcome %+v)", replay, outcomes[1])
	}
	if _, ok := replay.Headers.Get(ExpiresHeader); !ok {
		t.Fatalf("the replay has no %s: %+v", ExpiresHeader, replay.Headers)
	}
	retry, _ := busy.Headers.Get("Retry-After")
	if mismatch.Status != 422 || busy.Status != 409 || retry != "1" {
		t.Fatalf("mismatch %d, in progress %d (Retry-After %q)", mismatch.Status, busy.Status,
			retry)
	}
	// The answers count as Handle's do (the two Handle calls above started).
	if n := client.Counters(); n.Replayed != 1 || n.Mismatched != 1 || n.InProgress != 1 ||
		n.Started != 2 {
		t.Fatalf("counters %+v, want 1 replayed, 1 mismatched, 1 in progress", n)
	}
	// The work of the started keys, then their responses in one call.
	started := []Request{reqs[0], reqs[4]}
	responses := make([]Response, len(started))
	for i, req := range started {
		if responses[i], err = createOrder(who, 201, new(int))(ctx, tx); err != nil {
			t.Fatal(err)
		}
		responses[i].Body = []byte(req.Key)
	}
	completions, err := client.CompleteBatch(ctx, tx, started, responses)
	if err != nil {
		t.Fatal(err)
	}
	if len(completions) != 2 || completions[0] != (BatchCompletion{1, "new-1", true}) ||
		completions[1] != (BatchCompletion{2, "new-2", true}) {
		t.Fatalf("completions %+v", completions)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Both are replayed now, each with its own body; 4 orders in all.
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.BeginBatch(ctx, tx, started)
	if err != nil {
		t.Fatal(err)
	}
	_ = tx.Commit(ctx)
	if batchKeys(again) != "1:new-1:replay 2:new-2:replay" ||
		string(again[0].Response.Body) != "new-1" || string(again[1].Response.Body) != "new-2" {
		t.Fatalf("second batch %s", batchKeys(again))
	}
	if n := orders(t, who); n != 4 {
		t.Fatalf("%d orders, want 4", n)
	}
}

// batchError runs a batch call in a transaction of its own and returns its error.
func batchError(t *testing.T, call func(ctx context.Context, tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := connect(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return call(ctx, tx)
}

func TestBatchesRefuseBadInput(t *testing.T) {
	who, client := principal(t), newClient(t, Options{})
	many := make([]Request, 1001)
	for i := range many {
		many[i] = orderRequest(who, fmt.Sprintf("k%d", i), order)
	}
	cases := []struct {
		name, state string
		call        func(ctx context.Context, tx pgx.Tx) error
	}{
		{"a duplicate key", "22023", func(ctx context.Context, tx pgx.Tx) error {
			_, err := client.BeginBatch(ctx, tx, []Request{orderRequest(who, "a", order),
				orderRequest(who, "a", order)})
			return err
		}},
		{"1001 keys", "54000", func(ctx context.Context, tx pgx.Tx) error {
			_, err := client.BeginBatch(ctx, tx, many)
			return err
		}},
		{"a status that is not final", "22023", func(ctx context.Context, tx pgx.Tx) error {
			req := orderRequest(who, "b", order)
			if _, err := client.BeginBatch(ctx, tx, []Request{req}); err != nil {
				return err
			}
			_, err := client.CompleteBatch(ctx, tx, []Request{req}, []Response{{Status: 500}})
			return err
		}},
		{"a duplicate claim", "22023", func(ctx context.Context, tx pgx.Tx) error {
			_, err := ClaimBatch(ctx, tx, who, []string{"c", "c"}, 0)
			return err
		}},
	}
	for _, c := range cases {
		if err := batchError(t, c.call); sqlState(err) != c.state {
			t.Errorf("%s: error %v, want SQLSTATE %s", c.name, err, c.state)
		}
	}
	// Refused by the client before the server: one principal, a key each, matching lengths.
	client2 := []Request{orderRequest(who, "a", order), orderRequest(who+"x", "b", order)}
	noKey := []Request{orderRequest(who, "", order)}
	for name, call := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"two principals": func(ctx context.Context, tx pgx.Tx) error {
			_, err := client.BeginBatch(ctx, tx, client2)
			return err
		},
		"no key": func(ctx context.Context, tx pgx.Tx) error {
			_, err := client.BeginBatch(ctx, tx, noKey)
			return err
		},
		"two requests, one response": func(ctx context.Context, tx pgx.Tx) error {
			_, err := client.CompleteBatch(ctx, tx, client2, []Response{{Status: 201}})
			return err
		},
	} {
		if err := batchError(t, call); err == nil || sqlState(err) != "" {
			t.Errorf("%s: error %v, want the client's own", name, err)
		}
	}
	if got, err := client.BeginBatch(context.Background(), nil, nil); got != nil || err != nil {
		t.Errorf("an empty batch: %v, %v", got, err)
	}
}

func TestClaimBatchClaimsEachKeyOnceAndRollsBackWithTheTransaction(t *testing.T) {
	ctx, who, conn := context.Background(), principal(t), connect(t)
	claimed := func(claims []BatchClaim, err error) string {
		if err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(claims))
		for i, c := range claims {
			parts[i] = fmt.Sprintf("%d:%s:%v", c.Ord, c.Key, c.Claimed)
		}
		return strings.Join(parts, " ")
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := claimed(ClaimBatch(ctx, tx, who, []string{"b", "a"}, 0)); got != "1:b:true 2:a:true" {
		t.Fatalf("in a transaction: %s", got)
	}
	_ = tx.Rollback(ctx)
	if got := claimed(ClaimBatch(ctx, conn, who, []string{"a", "b"}, 0)); got != "1:a:true 2:b:true" {
		t.Fatalf("after the rollback: %s", got)
	}
	if got := claimed(ClaimBatch(ctx, conn, who, []string{"c", "b"}, 0)); got != "1:c:true 2:b:false" {
		t.Fatalf("again: %s", got)
	}
}

// Two batches over the same keys in opposite orders, at once: no deadlock,
// each key claimed exactly once.
func TestClaimBatchesInOppositeOrdersDoNotDeadlock(t *testing.T) {
	ctx, who := context.Background(), principal(t)
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}
	reversed := make([]string, len(keys))
	for i, k := range keys {
		reversed[len(keys)-1-i] = k
	}
	var wg sync.WaitGroup
	counts := make([]map[string]bool, 2)
	errs := make([]error, 2)
	for i, list := range [][]string{keys, reversed} {
		wg.Add(1)
		go func(i int, order []string, conn *pgx.Conn) {
			defer wg.Done()
			tx, err := conn.Begin(ctx)
			if err == nil {
				var claims []BatchClaim
				claims, err = ClaimBatch(ctx, tx, who, order, 0)
				time.Sleep(100 * time.Millisecond) // hold the keys a while
				counts[i] = map[string]bool{}
				for _, c := range claims {
					counts[i][c.Key] = c.Claimed
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
			}
			errs[i] = err
		}(i, list, connect(t))
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("a batch failed: %v", err)
		}
	}
	for _, k := range keys {
		if counts[0][k] == counts[1][k] {
			t.Fatalf("key %s claimed by both or neither: %v %v", k, counts[0][k], counts[1][k])
		}
	}
}
