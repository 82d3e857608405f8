package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/pg-idempotency/pg-idempotency/client/go"
	"github.com/pg-idempotency/pg-idempotency/examples/go-orders/ordersdb"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// The example against a database that has the extension (IDEM_GO_TEST_DSN, set by
// tests/integration/go_client.sh): River's job inserted with InsertTx in the
// request's transaction, and the sqlc-shaped queries on that transaction.

// The queries of ordersdb take the handler's transaction as they are.
var _ ordersdb.DBTX = pgx.Tx(nil)

var testPool *pgxpool.Pool

func TestMain(m *testing.M) {
	dsn := os.Getenv("IDEM_GO_TEST_DSN")
	if dsn == "" {
		fmt.Println("IDEM_GO_TEST_DSN is not set: the example's tests need a database with the" +
			" extension (tests/integration/go_client.sh); skipped")
		os.Exit(0)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err == nil {
		err = setup(ctx, pool) // River's migrations, then the tables
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot prepare the test database:", err)
		os.Exit(1)
	}
	testPool = pool
	code := m.Run()
	pool.Close()
	os.Exit(code)
}

var principals int64

func principal(t *testing.T) string {
	return fmt.Sprintf("river-%d-%d", time.Now().UnixNano(), atomic.AddInt64(&principals, 1))
}

// riverService serves POST /river/orders, and /then/N: the same handler (the
// order and its job inserted), whose answer is then replaced by status N.
func riverService(t *testing.T) *httptest.Server {
	t.Helper()
	jobs, err := newJobs(testPool, testPool) // not started: InsertTx only
	if err != nil {
		t.Fatal(err)
	}
	s := &service{pool: testPool, jobs: jobs, flakyFailed: map[[2]string]bool{}}
	client, err := idempotency.NewClient(idempotency.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keyed := idempotency.Middleware(idempotency.MiddlewareOptions{Client: client,
		Connections: idempotency.FromPool(testPool), Principal: principalOf,
		OnError: func(r *http.Request, err error) { t.Logf("OnError: %v", err) }})
	mux := http.NewServeMux()
	mux.Handle("/river/orders", keyed(http.HandlerFunc(s.riverOrders)))
	mux.Handle("/then/", keyed(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		state, body, _ := keyedCall(w, r)
		answer, _ := s.createQueuedOrder(r.Context(), state.Tx, state.Request.Principal, body)
		count, err := ordersdb.New(state.Tx).CountOrders(r.Context(), state.Request.Principal)
		if answer.status != 201 || err != nil || count != 1 {
			t.Errorf("in the transaction: %d, %d orders, %v", answer.status, count, err)
		}
		status, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/then/"))
		send(w, problem(status, http.StatusText(status), "replaced"))
	})))
	server := httptest.NewServer(mux)
	t.Cleanup(server.Close)
	return server
}

type reply struct {
	status   int
	replayed bool
	body     []byte
}

func post(t *testing.T, server *httptest.Server, path, who, key string) reply {
	t.Helper()
	request, _ := http.NewRequest(http.MethodPost, server.URL+path,
		strings.NewReader(`{"item":"book","quantity":2}`))
	request.Header.Set("Authorization", "Bearer "+who)
	request.Header.Set(idempotency.KeyHeader, key)
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	body, _ := io.ReadAll(response.Body)
	return reply{response.StatusCode, response.Header.Get(idempotency.ReplayHeader) == "true", body}
}

func count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := testPool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// jobsOf counts the order_created jobs of a principal; ordersOf its orders (through
// the sqlc-shaped queries on the pool).
func jobsOf(t *testing.T, who string) int64 {
	return count(t, "SELECT count(*) FROM river_job WHERE kind = 'order_created'"+
		" AND args->>'principal' = $1", who)
}

func ordersOf(t *testing.T, who string) int64 {
	n, err := ordersdb.New(testPool).CountOrders(context.Background(), who)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAJobExistsExactlyWhenTheRequestCommitted(t *testing.T) {
	server := riverService(t)
	t.Run("committed: one job, and a replay adds none", func(t *testing.T) {
		who := principal(t)
		first := post(t, server, "/river/orders", who, "k")
		again := post(t, server, "/river/orders", who, "k")
		if first.status != 201 || first.replayed || again.status != 201 || !again.replayed ||
			!bytes.Equal(first.body, again.body) {
			t.Fatalf("%+v %+v", first, again)
		}
		if jobs, orders := jobsOf(t, who), ordersOf(t, who); jobs != 1 || orders != 1 {
			t.Fatalf("%d jobs, %d orders", jobs, orders)
		}
		if !bytes.Contains(first.body, []byte(`"job":`)) {
			t.Errorf("no job id in %s", first.body)
		}
	})
	t.Run("a 5xx, a 429 and a final 4xx leave no job", func(t *testing.T) {
		who := principal(t)
		for _, status := range []int{500, 503, 429, 409, 404, 422} {
			path := fmt.Sprintf("/then/%d", status)
			r := post(t, server, path, who, "k"+path)
			if r.status != status {
				t.Fatalf("%s: %+v", path, r)
			}
			if again := post(t, server, path, who, "k"+path); again.status != status ||
				again.replayed != (status < 500 && status != 429) {
				t.Fatalf("retry of %s: %+v", path, again)
			}
		}
		if jobs, orders := jobsOf(t, who), ordersOf(t, who); jobs != 0 || orders != 0 {
			t.Fatalf("%d jobs, %d orders", jobs, orders)
		}
	})
	t.Run("16 parallel duplicates give one job", func(t *testing.T) {
		who := principal(t)
		replies := make([]reply, 16)
		var wg sync.WaitGroup
		for i := range replies {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				replies[i] = post(t, server, "/river/orders", who, "parallel")
			}(i)
		}
		wg.Wait()
		for _, r := range replies {
			if r.status != 201 || !bytes.Equal(r.body, replies[0].body) {
				t.Errorf("%+v", r)
			}
		}
		if jobs, orders := jobsOf(t, who), ordersOf(t, who); jobs != 1 || orders != 1 {
			t.Fatalf("%d jobs, %d orders", jobs, orders)
		}
	})
}

func TestRiverRunsTheCleanupAtStart(t *testing.T) {
	ctx, who := context.Background(), principal(t)
	// An earlier run's cleanup of this minute would keep this one out (ByPeriod).
	_, err := testPool.Exec(ctx, "DELETE FROM river_job WHERE kind = 'idempotency_cleanup'")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testPool.Exec(ctx, "SELECT idempotency.claim($1, 'old', '1 millisecond')",
		who); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	jobs, err := newJobs(testPool, testPool)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = jobs.Stop(ctx) }()
	const done = "SELECT count(*) FROM river_job WHERE kind = 'idempotency_cleanup'" +
		" AND state = 'completed'"
	for deadline := time.Now().Add(30 * time.Second); count(t, done) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no completed idempotency_cleanup job within 30 s of River's start")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := count(t, "SELECT count(*) FROM idempotency.keys WHERE principal = $1", who); n != 0 {
		t.Fatalf("%d expired keys left", n)
	}
}

func TestTheCleanupJobDeletesExpiredKeys(t *testing.T) {
	ctx, who := context.Background(), principal(t)
	for _, key := range []string{"a", "b", "c"} {
		if _, err := testPool.Exec(ctx, "SELECT idempotency.claim($1, $2, '1 millisecond')", who,
			key); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	worker := keyCleanupWorker{pool: testPool}
	for i := 0; i < 2; i++ { // twice: the second finds nothing to do
		if err := worker.Work(ctx, &river.Job[keyCleanup]{}); err != nil {
			t.Fatal(err)
		}
		if n := count(t, "SELECT count(*) FROM idempotency.keys WHERE principal = $1", who); n != 0 {
			t.Fatalf("run %d: %d keys left", i+1, n)
		}
	}
}
