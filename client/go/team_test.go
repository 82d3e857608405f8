package idempotency

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// A Go API team's own idempotency list (issue 36), through the middleware on pgx
// v5, plus the settings per route: one Client and one pool serve every route.

// teamService has the routes of the list: /orders (the Client's settings),
// /short (Route TTL 1 s), /reject (Route Wait Reject), /wait (WaitUpTo 150 ms),
// /open (no method requires a key), /nobody (Principal answers ("", true)).
func teamService(t *testing.T, errs *[]error) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	base := MiddlewareOptions{Client: newClient(t, Options{}), Connections: FromPool(newPool(t)),
		Principal: func(r *http.Request) (string, bool) {
			token, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			return token, found && token != ""
		},
		OnError: func(r *http.Request, err error) {
			mu.Lock()
			defer mu.Unlock()
			*errs = append(*errs, err)
		}}
	on := func(route Route) func(http.Handler) http.Handler {
		options := base
		options.Route = route
		return Middleware(options)
	}
	nobody := base
	nobody.Principal = func(*http.Request) (string, bool) { return "", true }
	handler := orderHandler(t)
	mux := http.NewServeMux()
	mux.Handle("/orders", on(Route{})(handler))
	mux.Handle("/other", on(Route{})(handler))
	mux.Handle("/short", on(Route{TTL: time.Second})(handler))
	mux.Handle("/reject", on(Route{Wait: Reject})(handler))
	mux.Handle("/wait", on(Route{Wait: WaitUpTo(150 * time.Millisecond)})(handler))
	mux.Handle("/open", on(Route{MethodsRequiringKey: []string{}})(handler))
	mux.Handle("/nobody", Middleware(nobody)(handler))
	server := httptest.NewServer(mux)
	t.Cleanup(server.Close)
	return server
}

// holdKey begins the key in a transaction of its own, left open until the test ends.
func holdKey(t *testing.T, who, key, path string) {
	ctx := context.Background()
	tx, err := connect(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "SELECT * FROM idempotency.begin($1, $2, 'POST '||$3,"+
		" idempotency.fingerprint('POST', $3, $4::bytea))", who, key, path, []byte(order))
	if err != nil {
		t.Fatal(err)
	}
}

func TestTheTeamsList(t *testing.T) {
	ordersTable(t)
	var errs []error
	server := teamService(t, &errs)
	is := func(r reply, status int, replayed bool) bool {
		return r.status == status && (r.header.Get(ReplayHeader) == "true") == replayed
	}
	t.Run("replay with the header", func(t *testing.T) {
		who := principal(t)
		first, again := post(t, server, "/orders", who, "k", order),
			post(t, server, "/orders", who, "k", order)
		if !is(first, 201, false) || !is(again, 201, true) || !bytes.Equal(first.body, again.body) ||
			orders(t, who) != 1 {
			t.Fatalf("%+v %+v", first, again)
		}
	})
	t.Run("reuse by body and by path is 422", func(t *testing.T) {
		who := principal(t)
		post(t, server, "/orders", who, "k", order)
		body := post(t, server, "/orders", who, "k", `{"item":"pen"}`)
		path := post(t, server, "/other", who, "k", order)
		if body.status != 422 || path.status != 422 || orders(t, who) != 1 {
			t.Fatalf("%+v %+v", body, path)
		}
	})
	t.Run("canonical JSON replays", func(t *testing.T) {
		who := principal(t)
		post(t, server, "/orders", who, "k", order)
		if r := post(t, server, "/orders", who, "k", orderRespelled); !is(r, 201, true) {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("409 after the wait (route WaitUpTo), at once on a Reject route", func(t *testing.T) {
		who := principal(t)
		holdKey(t, who, "held", "/wait")
		holdKey(t, who, "held2", "/reject")
		started := time.Now()
		waited := post(t, server, "/wait", who, "held", order)
		tookWait := time.Since(started)
		started = time.Now()
		rejected := post(t, server, "/reject", who, "held2", order)
		tookReject := time.Since(started)
		if waited.status != 409 || tookWait < 150*time.Millisecond || rejected.status != 409 ||
			tookReject > 140*time.Millisecond || rejected.header.Get("Retry-After") == "" {
			t.Fatalf("wait %d after %v, reject %d after %v", waited.status, tookWait,
				rejected.status, tookReject)
		}
	})
	t.Run("16 parallel duplicates: one effect", func(t *testing.T) {
		who := principal(t)
		replies := make([]reply, 16)
		var wg sync.WaitGroup
		for i := range replies {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				replies[i] = post(t, server, "/orders", who, "parallel", order)
			}(i)
		}
		wg.Wait()
		for _, r := range replies {
			if r.status != 201 || !bytes.Equal(r.body, replies[0].body) {
				t.Errorf("%+v", r)
			}
		}
		if n := orders(t, who); n != 1 {
			t.Fatalf("%d orders", n)
		}
	})
	t.Run("401 step-up, then success", func(t *testing.T) {
		who := principal(t)
		first := post(t, server, "/orders?status=401", who, "k", order)
		second := post(t, server, "/orders", who, "k", order)
		if !is(first, 401, false) || !is(second, 201, false) || orders(t, who) != 1 {
			t.Fatalf("%+v %+v", first, second)
		}
	})
	t.Run("5xx, 429 and 428 are never stored", func(t *testing.T) {
		who := principal(t)
		for i, status := range []string{"500", "503", "429", "428"} {
			if r := post(t, server, "/orders?status="+status, who, "k"+status, order); r.status <
				400 || orders(t, who) != int64(i) {
				t.Fatalf("%s: %+v", status, r)
			}
			if r := post(t, server, "/orders", who, "k"+status, order); !is(r, 201, false) {
				t.Fatalf("retry after %s: %+v", status, r)
			}
		}
	})
	t.Run("a stored 404 and 409 are replayed without effect", func(t *testing.T) {
		who := principal(t)
		for _, status := range []string{"404", "409"} {
			first := post(t, server, "/orders?status="+status, who, "k"+status, order)
			again := post(t, server, "/orders", who, "k"+status, order)
			if first.status != again.status || !is(again, first.status, true) || orders(t, who) != 0 {
				t.Fatalf("%s: %+v %+v", status, first, again)
			}
		}
	})
	t.Run("keys are per principal", func(t *testing.T) {
		one, two := principal(t), principal(t)
		a, b := post(t, server, "/orders", one, "k", order), post(t, server, "/orders", two, "k", order)
		if !is(a, 201, false) || !is(b, 201, false) || orders(t, one)+orders(t, two) != 2 {
			t.Fatalf("%+v %+v", a, b)
		}
	})
	t.Run("a one-time secret is sent once", func(t *testing.T) {
		who := principal(t)
		post(t, server, "/orders?secret=1", who, "k", order)
		if r := post(t, server, "/orders", who, "k", order); r.status != 409 ||
			!bytes.Contains(r.body, []byte("one-time-secret")) {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("expiry: a route's TTL ends the key", func(t *testing.T) {
		who := principal(t)
		first := post(t, server, "/short", who, "k", order)
		expires, _ := http.ParseTime(first.header.Get(ExpiresHeader))
		if ahead := time.Until(expires); ahead > 2*time.Second {
			t.Fatalf("Idempotency-Expires %v ahead with a 1 s route TTL", ahead)
		}
		time.Sleep(1100 * time.Millisecond)
		if r := post(t, server, "/short", who, "k", order); !is(r, 201, false) || orders(t, who) != 2 {
			t.Fatalf("after expiry: %+v", r)
		}
	})
	t.Run("invalid keys are 400", func(t *testing.T) {
		who := principal(t)
		for _, key := range []string{strings.Repeat("k", 256), "ключ"} {
			if r := post(t, server, "/orders", who, key, order); r.status != 400 ||
				!bytes.Contains(r.body, []byte("idempotency-key-malformed")) {
				t.Fatalf("%q: %+v", key, r)
			}
		}
		if r := post(t, server, "/orders", who, "", order); r.status != 400 {
			t.Fatalf("no key: %+v", r)
		}
	})
	t.Run("pass-through without a key and for anonymous actors", func(t *testing.T) {
		who := principal(t)
		open := post(t, server, "/open", who, "", order)
		anonymous := post(t, server, "/orders", "", "", order)
		if !is(open, 201, false) || orders(t, who) != 1 || anonymous.status != 201 {
			t.Fatalf("%+v %+v", open, anonymous)
		}
	})
	t.Run("the empty principal is a 401 problem and reaches OnError", func(t *testing.T) {
		errs = nil
		r := post(t, server, "/nobody", "", "k", order)
		if r.status != 401 || r.header.Get("Content-Type") != ProblemContentType ||
			!bytes.Contains(r.body, []byte(`"type":"about:blank"`)) ||
			len(errs) != 1 || !errors.Is(errs[0], ErrEmptyPrincipal) {
			t.Fatalf("%+v %v", r, errs)
		}
	})
	t.Run("cleanup in batches, and twice", func(t *testing.T) {
		who := principal(t)
		for _, key := range []string{"c1", "c2", "c3", "c4", "c5"} {
			exec1(t, "SELECT idempotency.claim($1, $2, '1 millisecond')", who, key)
		}
		time.Sleep(10 * time.Millisecond)
		for i := 0; i < 2; i++ {
			if deleted := scalarInt(t, "CALL idempotency.cleanup(2, NULL, NULL, NULL)"); i == 0 &&
				deleted < 5 {
				t.Fatalf("deleted %d", deleted)
			}
			if n := scalarInt(t, "SELECT count(*) FROM idempotency.keys WHERE principal = $1",
				who); n != 0 {
				t.Fatalf("run %d: %d keys left", i, n)
			}
		}
	})
}

func TestBadSettingsAreErrorsNotPanics(t *testing.T) {
	if _, err := NewClient(Options{TTL: -time.Second}); err == nil {
		t.Error("a negative TTL was accepted by NewClient")
	}
	if _, err := NewLeaseRunner(nil, LeaseOptions{TTL: -time.Second}); err == nil {
		t.Error("a negative TTL was accepted by NewLeaseRunner")
	}
	client := newClient(t, Options{})
	request := orderRequest(principal(t), "k", order)
	request.Route.TTL = -time.Second
	calls := 0
	if _, err := client.Handle(context.Background(), connect(t), request,
		createOrder("x", 201, &calls)); err == nil || calls != 0 {
		t.Errorf("a route's negative TTL: %v, %d calls", err, calls)
	}
	if Reject.String() != "reject" || WaitUpTo(time.Second).String() != "up to 1s" ||
		WaitServer.String() != "server" {
		t.Error("Wait names")
	}
}
