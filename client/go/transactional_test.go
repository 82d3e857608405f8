package idempotency

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const order = `{"item":"book","quantity":2}`

// The same document spelled differently; its RFC 8785 form is order's.
const orderRespelled = "{ \"quantity\" : 2.0e0,\n \"item\" : \"b\\u006fok\" }"

func ordersTable(t *testing.T) {
	exec1(t,
		"CREATE TABLE IF NOT EXISTS go_orders (id bigserial PRIMARY KEY, principal text NOT NULL,"+
			" item text NOT NULL)")
}

func newClient(t *testing.T, options Options) *Client {
	t.Helper()
	client, err := NewClient(options)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

func orderRequest(who, key, body string) Request {
	return Request{Principal: who, Key: key, Method: "POST", Path: "/orders", Body: []byte(body)}
}

// createOrder is a handler that inserts one order and answers 201, or status.
func createOrder(who string, status int, calls *int) Handler {
	return func(ctx context.Context, tx pgx.Tx) (Response, error) {
		*calls++
		var id int64
		err := tx.QueryRow(ctx,
			"INSERT INTO go_orders (principal, item) VALUES ($1, 'book') RETURNING id",
			who).Scan(&id)
		if err != nil {
			return Response{}, err
		}
		return Response{Status: status, Headers: Headers{{"Content-Type", "application/json"},
			{"Location", "/orders/1"}, {"X-Not-Kept", "1"}}, Body: []byte(`{"id":1}`),
			ResourceID: "1"}, nil
	}
}

func orders(t *testing.T, who string) int64 {
	return scalarInt(t, "SELECT count(*) FROM go_orders WHERE principal = $1", who)
}

func TestDuplicateIsReplayedAndMismatchIs422(t *testing.T) {
	ordersTable(t)
	conn, client, who, ctx := connect(t), newClient(t, Options{}), principal(t),
		context.Background()
	calls := 0
	first, err := client.Handle(ctx, conn, orderRequest(who, "k1", order), createOrder(who, 201,
		&calls))
	if err != nil || first.Status != 201 || first.Replayed {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := client.Handle(ctx, conn, orderRequest(who, "k1", orderRespelled), createOrder(who,
		201, &calls))
	if err != nil || again.Status != 201 || !again.Replayed || !bytes.Equal(again.Body,
		first.Body) {
		t.Fatalf("replay: %+v %v", again, err)
	}
	if v, _ := again.Headers.Get(ReplayHeader); v != "true" {
		t.Errorf("replay header: %q", v)
	}
	if v, _ := again.Headers.Get("Location"); v != "/orders/1" {
		t.Errorf("kept Location: %q", v)
	}
	if _, found := again.Headers.Get("X-Not-Kept"); found {
		t.Errorf("a header that is not kept was replayed: %+v", again.Headers)
	}
	other, err := client.Handle(ctx, conn, orderRequest(who, "k1", `{"item":"pen"}`),
		createOrder(who, 201, &calls))
	if err != nil || other.Status != 422 || string(other.Body) != cppKeyReuse {
		t.Fatalf("mismatch: %d %s %v", other.Status, other.Body, err)
	}
	if calls != 1 || orders(t, who) != 1 {
		t.Errorf("effects: %d calls, %d orders", calls, orders(t, who))
	}
	if c := client.Counters(); c.Started != 1 || c.Replayed != 1 || c.Mismatched != 1 {
		t.Errorf("counters: %+v", c)
	}
	if conn.PgConn().TxStatus() != 'I' {
		t.Errorf("connection left in a transaction")
	}
}

func TestHeldKeyIs409WithRetryAfter(t *testing.T) {
	ordersTable(t)
	ctx, who := context.Background(), principal(t)
	holder := connect(t)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var outcome string
	err = tx.QueryRow(ctx, "SELECT outcome FROM idempotency.begin($1, 'held', 'test',"+
		" idempotency.fingerprint('POST', '/orders', $2::bytea))", who,
		[]byte(order)).Scan(&outcome)
	if err != nil || outcome != "started" {
		t.Fatalf("holder: %s %v", outcome, err)
	}
	client := newClient(t, Options{Wait: WaitUpTo(200 * time.Millisecond), RetryAfter: 2})
	calls := 0
	busy, err := client.Handle(ctx, connect(t), orderRequest(who, "held", order), createOrder(who,
		201, &calls))
	if err != nil || busy.Status != 409 || calls != 0 {
		t.Fatalf("busy: %+v %v", busy, err)
	}
	if v, _ := busy.Headers.Get("Retry-After"); v != "2" {
		t.Errorf("Retry-After %q", v)
	}
	if !strings.Contains(string(busy.Body), `"type":"/problems/request-in-progress"`) {
		t.Errorf("body %s", busy.Body)
	}
	_ = tx.Rollback(ctx)
	retry, err := client.Handle(ctx, connect(t), orderRequest(who, "held", order), createOrder(who,
		201, &calls))
	if err != nil || retry.Status != 201 || retry.Replayed || calls != 1 {
		t.Fatalf("after rollback: %+v %v", retry, err)
	}
}

func TestConcurrentDuplicateWaitsAndReplays(t *testing.T) {
	ordersTable(t)
	ctx, who, client := context.Background(), principal(t), newClient(t, Options{})
	slow := func(ctx context.Context, tx pgx.Tx) (Response, error) {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.5)"); err != nil {
			return Response{}, err
		}
		return createOrder(who, 201, new(int))(ctx, tx)
	}
	var wg sync.WaitGroup
	results := make([]Response, 2)
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			conn := connect(t)
			time.Sleep(time.Duration(i) * 200 * time.Millisecond)
			results[i], _ = client.Handle(ctx, conn, orderRequest(who, "c", order), slow)
		}(i)
	}
	wg.Wait()
	if results[0].Replayed { // the machine was slow enough to swap them: the claim is the same
		results[0], results[1] = results[1], results[0]
	}
	if results[0].Status != 201 || results[0].Replayed || !results[1].Replayed ||
		!bytes.Equal(results[0].Body, results[1].Body) || orders(t, who) != 1 {
		t.Fatalf("results %+v, %d orders", results, orders(t, who))
	}
}

func TestFinalErrorIsStoredAndNonFinalIsNot(t *testing.T) {
	ordersTable(t)
	conn, client, who, ctx := connect(t), newClient(t, Options{}), principal(t),
		context.Background()
	calls := 0
	failed, err := client.Handle(ctx, conn, orderRequest(who, "e", order), createOrder(who, 500,
		&calls))
	if err != nil || failed.Status != 500 || orders(t, who) != 0 {
		t.Fatalf("500: %+v %v, %d orders", failed, err, orders(t, who))
	}
	retry, err := client.Handle(ctx, conn, orderRequest(who, "e", order), createOrder(who, 201,
		&calls))
	if err != nil || retry.Status != 201 || retry.Replayed || calls != 2 || orders(t, who) != 1 {
		t.Fatalf("retry after 500: %+v %v", retry, err)
	}
	bad, err := client.Handle(ctx, conn, orderRequest(who, "f", order), createOrder(who, 404,
		&calls))
	if err != nil || bad.Status != 404 || orders(t, who) != 1 {
		t.Fatalf("404: %+v %v", bad, err)
	}
	replayed, err := client.Handle(ctx, conn, orderRequest(who, "f", order), createOrder(who, 201,
		&calls))
	if err != nil || replayed.Status != 404 || !replayed.Replayed || calls != 3 {
		t.Fatalf("stored 404: %+v %v", replayed, err)
	}
	if c := client.Counters(); c.NotStored != 1 || c.StoredErrors != 1 {
		t.Errorf("counters %+v", c)
	}
}

func TestOneTimeSecretIsNotStored(t *testing.T) {
	conn, client, who, ctx := connect(t), newClient(t, Options{}), principal(t),
		context.Background()
	secret := func(ctx context.Context, tx pgx.Tx) (Response, error) {
		return Response{Status: 201, Body: []byte(`{"secret":"sk_1"}`), OneTimeSecret: true}, nil
	}
	first, err := client.Handle(ctx, conn, orderRequest(who, "s", "{}"), secret)
	if err != nil || first.Status != 201 {
		t.Fatalf("%+v %v", first, err)
	}
	again, err := client.Handle(ctx, conn, orderRequest(who, "s", "{}"), secret)
	if err != nil || again.Status != 409 || !again.Replayed || bytes.Contains(again.Body,
		[]byte("sk_")) ||
		!strings.Contains(string(again.Body), "/problems/one-time-secret") {
		t.Fatalf("%+v %v", again, err)
	}
	if n := scalarInt(t,
		"SELECT count(*) FROM idempotency.lookup($1, 's') WHERE response_status = 201"+
			" AND one_time_secret", who); n != 1 {
		t.Errorf("stored row: %d", n)
	}
}

func TestMissingAndMalformedKeys(t *testing.T) {
	conn, client, who, ctx := connect(t), newClient(t, Options{}), principal(t),
		context.Background()
	calls := 0
	cases := map[string]string{"": "idempotency-key-missing", strings.Repeat("k",
		256): "idempotency-key-malformed",
		"cl\u00e9": "idempotency-key-malformed"}
	for key, slug := range cases {
		got, err := client.Handle(ctx, conn, orderRequest(who, key, order), createOrder(who, 201,
			&calls))
		if err != nil || got.Status != 400 || !strings.Contains(string(got.Body), slug) {
			t.Errorf("key %q: %+v %v", key, got, err)
		}
	}
	get := Request{Principal: who, Method: "GET", Path: "/orders"}
	ran := false
	got, err := client.Handle(ctx, conn, get, func(ctx context.Context, tx pgx.Tx) (Response,
		error) {
		ran = true
		return Response{Status: 200}, nil
	})
	if err != nil || !ran || got.Status != 200 || calls != 0 {
		t.Errorf("GET without a key: %+v %v", got, err)
	}
}

func TestSerializationFailureIsRetriedWithAFreshResponse(t *testing.T) {
	ordersTable(t)
	conn, client, who, ctx := connect(t), newClient(t, Options{}), principal(t),
		context.Background()
	runs := 0
	handler := func(ctx context.Context, tx pgx.Tx) (Response, error) {
		runs++
		if _, err := tx.Exec(ctx, "INSERT INTO go_orders (principal, item) VALUES ($1, 'x')",
			who); err != nil {
			return Response{}, err
		}
		if runs == 1 { // as a concurrent serializable transaction would make it fail
			_, _ = tx.Exec(ctx,
				"DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
			return Response{Status: 500, Body: []byte("partial")},
				nil // the error was noted by the Tx
		}
		return Response{Status: 201, Body: []byte("fresh")}, nil
	}
	got, err := client.Handle(ctx, conn, orderRequest(who, "r", order), handler)
	if err != nil || got.Status != 201 || string(got.Body) != "fresh" || runs != 2 || orders(t,
		who) != 1 {
		t.Fatalf("%+v %v runs %d orders %d", got, err, runs, orders(t, who))
	}
	if client.Counters().Retries != 1 {
		t.Errorf("retries %d", client.Counters().Retries)
	}
	boom := errors.New("boom")
	_, err = client.Handle(ctx, conn, orderRequest(who, "r2", order), func(ctx context.Context,
		tx pgx.Tx) (
		Response, error) {
		_, _ = tx.Exec(ctx, "INSERT INTO go_orders (principal, item) VALUES ($1, 'y')", who)
		return Response{}, boom
	})
	if !errors.Is(err, boom) || orders(t, who) != 1 || conn.PgConn().TxStatus() != 'I' {
		t.Fatalf("handler error: %v, %d orders", err, orders(t, who))
	}
}
