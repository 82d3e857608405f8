package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stale placements: node a's database runs tests/scale-out/fake_citus.sql, a stand-in
// for Citus's catalogs, so the extension there serves every principal in the
// distributed mode and refuses a locking call with the real 0A000 "the key's shard is
// not on this node" for a principal with a shard-2 row in pg_catalog.fake_citus_shard
// (moveAway). The placement query still reads go_route_fake in the test database.

// installFakeCitus runs tests/scale-out/fake_citus.sql (found from this package's
// folder, inside the repository) on pool, as one simple-protocol batch.
func installFakeCitus(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	text, err := os.ReadFile("../../tests/scale-out/fake_citus.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), string(text)); err != nil {
		t.Fatalf("fake_citus.sql: %v", err)
	}
}

// moveAway puts who's shard on another node, as node a sees it: a's locking calls
// for who are refused from now on.
func (e *routeEnv) moveAway(t *testing.T, who string) {
	t.Helper()
	_, err := e.pools["a"].Exec(context.Background(),
		"INSERT INTO pg_catalog.fake_citus_shard VALUES ($1, 2)", who)
	if err != nil {
		t.Fatal(err)
	}
}

// staleService is the middleware with router around a handler that counts its runs
// and writes an order; with "X-Claim: yes" it moves the principal's shard away inside
// its own transaction, then makes a locking call (claim), which node a refuses.
func staleService(t *testing.T, router *Router, runs *int64) *httptest.Server {
	handler := func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt64(runs, 1)
		state := FromContext(r.Context())
		who := state.Request.Principal
		var database string
		err := state.Tx.QueryRow(r.Context(), "INSERT INTO go_orders (principal, item)"+
			" VALUES ($1, 'book') RETURNING current_database()", who).Scan(&database)
		if err == nil && r.Header.Get("X-Claim") == "yes" {
			_, err = state.Tx.Exec(r.Context(),
				"INSERT INTO pg_catalog.fake_citus_shard VALUES ($1, 2)", who)
			if err == nil {
				_, err = state.Tx.Exec(r.Context(),
					"SELECT * FROM idempotency.claim($1, 'other', '1 minute')", who)
			}
		}
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(201)
		_, _ = w.Write([]byte(database))
	}
	wrap := Middleware(MiddlewareOptions{Client: newClient(t, Options{}), Router: router,
		Principal: func(r *http.Request) (string, bool) { return r.Header.Get("X-User"), true }})
	server := httptest.NewServer(wrap(http.HandlerFunc(handler)))
	t.Cleanup(server.Close)
	return server
}

// postAs sends a keyed request as who with a fresh key; the status and the body.
func postAs(t *testing.T, server *httptest.Server, who string, claim bool) (int, string) {
	t.Helper()
	request, _ := http.NewRequest(http.MethodPost, server.URL+"/orders", strings.NewReader("{}"))
	request.Header.Set("X-User", who)
	request.Header.Set(KeyHeader, fmt.Sprintf("k-%d", atomic.AddInt64(&routeKeys, 1)))
	if claim {
		request.Header.Set("X-Claim", "yes")
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	body, _ := io.ReadAll(response.Body)
	return response.StatusCode, string(body)
}

func TestRouterStalePlacement(t *testing.T) {
	env := newRouteEnvNamed(t, "stale", true)
	t.Run("ARefusedBeginRunsOnceMoreOnTheNewNode", func(t *testing.T) { staleRetried(t, env) })
	t.Run("StaleTwiceFails", func(t *testing.T) { staleTwice(t, env) })
	t.Run("StaleInTheHandlerIsReportedNotRerun", func(t *testing.T) { staleInHandler(t, env) })
	t.Run("TheServersRefusalIsStale", func(t *testing.T) { staleServerError(t, env) })
	t.Run("ReportDropsTheEntryOnly", func(t *testing.T) { staleReport(t, env) })
	t.Run("NodeSessionsAreRouted", func(t *testing.T) { nodeSessionsRouted(t, env) })
}

// The nodes' pools (RoutedConfig) run with idempotency.routed on and keep the user's
// options; the default target's does not.
func nodeSessionsRouted(t *testing.T, env *routeEnv) {
	for node, want := range map[string]string{"default": "off", "a": "on 7MB", "b": "on 7MB"} {
		var routed, workMem string
		err := env.pools[node].QueryRow(context.Background(),
			"SELECT coalesce(current_setting('idempotency.routed', true), 'off'), current_setting('work_mem')").Scan(
			&routed, &workMem)
		if node != "default" {
			routed += " " + workMem
		}
		if err != nil || routed != want {
			t.Errorf("%s: SHOW idempotency.routed (work_mem) = %s (%v), want %s", node, routed,
				err, want)
		}
	}
}

func staleRetried(t *testing.T, env *routeEnv) {
	router := env.router(t, nil, RouterOptions{}) // Refresh 60 s: only the refusal refreshes
	var runs int64
	server, who := staleService(t, router, &runs), principal(t)
	env.place(t, who, "a.test")
	if status, body := postAs(t, server, who, false); status != 201 || body != env.names["a"] {
		t.Fatalf("first request: %d %s", status, body)
	}
	env.moveAway(t, who) // the shard moves to b: a refuses, the placement query says b
	env.place(t, who, "b.test")
	if status, body := postAs(t, server, who, false); status != 201 || body != env.names["b"] {
		t.Fatalf("after the move: %d %s", status, body)
	}
	if runs != 2 {
		t.Errorf("the handler ran %d times, want 2 (once per request)", runs)
	}
	if got := env.where(t, who); got != "default 0/0, a 1/1, b 1/1" {
		t.Errorf("rows: %s", got)
	}
	want := RouterCounters{Lookups: 2, Routed: 3, StalePlacements: 1} // a, a (refused), b
	if got := router.Counters(); got != want {
		t.Errorf("counters %+v, want %+v", got, want)
	}
}

// The placement query still says a after the move: the rerun is refused too, and
// the request fails (500) without running the handler.
func staleTwice(t *testing.T, env *routeEnv) {
	router := env.router(t, nil, RouterOptions{})
	var runs int64
	server, who := staleService(t, router, &runs), principal(t)
	env.place(t, who, "a.test")
	postAs(t, server, who, false)
	env.moveAway(t, who)
	if status, _ := postAs(t, server, who, false); status != 500 {
		t.Errorf("status %d, want 500", status)
	}
	if got := env.where(t, who); runs != 1 || got != "default 0/0, a 1/1, b 0/0" {
		t.Errorf("%d runs, rows %s", runs, got)
	}
	want := RouterCounters{Lookups: 2, Routed: 3, StalePlacements: 2}
	if got := router.Counters(); got != want {
		t.Errorf("counters %+v, want %+v", got, want)
	}
}

// The handler's own locking call is refused: the handler has run, so the request is
// not rerun (its 500 is the answer), but the placement is dropped all the same.
func staleInHandler(t *testing.T, env *routeEnv) {
	router := env.router(t, nil, RouterOptions{})
	var runs int64
	server, who := staleService(t, router, &runs), principal(t)
	env.place(t, who, "a.test")
	if status, body := postAs(t, server, who, true); status != 500 ||
		!strings.Contains(body, StalePlacementMessage) {
		t.Errorf("%d %s", status, body)
	}
	if got := env.where(t, who); runs != 1 || got != "default 0/0, a 0/0, b 0/0" {
		t.Errorf("%d runs, rows %s", runs, got)
	}
	want := RouterCounters{Lookups: 1, Routed: 1, StalePlacements: 1}
	if got := router.Counters(); got != want || router.Len() != 0 {
		t.Errorf("counters %+v, want %+v; %d cached", got, want, router.Len())
	}
	postAs(t, server, who, false) // the handler's move was rolled back: a serves it
	if got := router.Counters().Lookups; got != 2 {
		t.Errorf("%d lookups: the placement was dropped", got)
	}
}

// The predicate matches node a's real refusal, and only it.
func staleServerError(t *testing.T, env *routeEnv) {
	who := principal(t)
	env.moveAway(t, who)
	_, err := env.pools["a"].Exec(context.Background(),
		"SELECT * FROM idempotency.claim($1, 'k', '1 minute')", who)
	if !IsStalePlacement(err) || !IsStalePlacement(fmt.Errorf("wrapped: %w", err)) {
		t.Errorf("node a's refusal is not stale: %v", err)
	}
	for _, other := range []error{
		nil,
		errors.New(StalePlacementMessage),
		&pgconn.PgError{Code: StalePlacementSQLState, Message: "cached plan must not change"},
		&pgconn.PgError{Code: "40001", Message: StalePlacementMessage},
	} {
		if IsStalePlacement(other) {
			t.Errorf("%#v is stale", other)
		}
	}
	if !IsStalePlacement(&pgconn.PgError{Code: "0A000", Message: StalePlacementMessage}) {
		t.Error("the protocol's error is not stale")
	}
}

// ReportStalePlacement drops the principal's entry and counts it; no node goes down.
func staleReport(t *testing.T, env *routeEnv) {
	router := env.router(t, nil, RouterOptions{})
	ctx, who := context.Background(), principal(t)
	env.place(t, who, "a.test")
	router.Route(ctx, who)
	router.ReportStalePlacement(who)
	router.ReportStalePlacement("never-routed") // counted, nothing to drop
	if router.Len() != 0 {
		t.Errorf("%d cached after the report", router.Len())
	}
	if node, _ := router.Route(ctx, who); node != "a.test:5432" {
		t.Errorf("routed to %q: the node must not be down", node)
	}
	want := RouterCounters{Lookups: 2, Routed: 2, StalePlacements: 2}
	if got := router.Counters(); got != want {
		t.Errorf("counters %+v, want %+v", got, want)
	}
}
