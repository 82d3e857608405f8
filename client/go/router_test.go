package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Router through the net/http middleware, on a fake placement: three databases of
// the test cluster stand for the nodes (the test database, "<db>_route_a" as
// a.test:5432 and "<db>_route_b" as b.test:5432), and the placement query reads
// go_route_fake in the test database. Each keyed request's handler writes an order:
// the key row and the order must land in the routed database and nowhere else.

const fakePlacement = "SELECT node_name, node_port FROM go_route_fake WHERE principal = $1"

type routeEnv struct {
	pools map[string]*pgxpool.Pool // "default", "a", "b"
	names map[string]string
	base  *pgx.ConnConfig
}

// newRouteEnv makes the two node databases (dropped with the test) and the fake table.
func newRouteEnv(t *testing.T) *routeEnv { return newRouteEnvNamed(t, "route", false) }

// newRouteEnvNamed is newRouteEnv with node databases "<db>_<prefix>_a" and "_b";
// fakeCitus runs tests/scale-out/fake_citus.sql in node a's right after its
// CREATE EXTENSION (before any session reads the key table's placement).
func newRouteEnvNamed(t *testing.T, prefix string, fakeCitus bool) *routeEnv {
	t.Helper()
	ctx := context.Background()
	base, err := pgx.ParseConfig(testDSN)
	if err != nil {
		t.Fatal(err)
	}
	env := &routeEnv{pools: map[string]*pgxpool.Pool{}, names: map[string]string{}, base: base}
	env.names["default"] = base.Database
	admin := connectTo(t, env.dsn("postgres", base.Port))
	for _, node := range []string{"a", "b"} {
		name := base.Database + "_" + prefix + "_" + node
		env.names[node] = name
		_, _ = admin.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS "%s" WITH (FORCE)`, name))
		if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE "%s"`, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, node := range []string{"a", "b"} {
			env.pools[node].Close()
			drop, err := pgx.Connect(ctx, env.dsn("postgres", base.Port))
			if err == nil {
				_, err = drop.Exec(ctx, fmt.Sprintf(`DROP DATABASE "%s" WITH (FORCE)`,
					env.names[node]))
				drop.Close(ctx)
			}
			if err != nil {
				t.Error(err)
			}
		}
	})
	for _, node := range []string{"default", "a", "b"} {
		// The nodes' pools as docs/go.md says: RoutedConfig, the user's options kept.
		config, err := pgxpool.ParseConfig(env.dsn(env.names[node], base.Port))
		if err == nil && node != "default" {
			config, err = pgxpool.ParseConfig(env.dsn(env.names[node], base.Port) +
				"?options=-c%20work_mem%3D7MB")
			config = RoutedConfig(config)
		}
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.NewWithConfig(ctx, config)
		if err != nil {
			t.Fatal(err)
		}
		env.pools[node] = pool
		if node == "default" {
			t.Cleanup(pool.Close)
			continue
		}
		if _, err := pool.Exec(ctx, "CREATE EXTENSION idempotency"); err != nil {
			t.Fatal(err)
		}
		if fakeCitus && node == "a" {
			installFakeCitus(t, pool)
		}
	}
	ordersTable(t)
	for _, node := range []string{"a", "b"} {
		_, err := env.pools[node].Exec(ctx, "CREATE TABLE go_orders (id bigserial PRIMARY KEY,"+
			" principal text NOT NULL, item text NOT NULL)")
		if err != nil {
			t.Fatal(err)
		}
	}
	exec1(t, "CREATE TABLE IF NOT EXISTS go_route_fake (principal text PRIMARY KEY,"+
		" node_name text, node_port int)")
	return env
}

func (e *routeEnv) dsn(database string, port uint16) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s", e.base.User, port, database)
}

func connectTo(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// place puts who on host:5432 ("" removes the placement).
func (e *routeEnv) place(t *testing.T, who, host string) {
	exec1(t, "DELETE FROM go_route_fake WHERE principal = $1", who)
	if host != "" {
		exec1(t, "INSERT INTO go_route_fake VALUES ($1, $2, 5432)", who, host)
	}
}

// where tells where who's rows are: "orders/keys" per database.
func (e *routeEnv) where(t *testing.T, who string) string {
	t.Helper()
	out := []string{}
	for _, node := range []string{"default", "a", "b"} {
		var orders, keys int64
		err := e.pools[node].QueryRow(context.Background(),
			"SELECT (SELECT count(*) FROM go_orders WHERE principal = $1),"+
				" (SELECT count(*) FROM idempotency.keys WHERE principal = $1)", who).Scan(&orders,
			&keys)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %d/%d", node, orders, keys))
	}
	return strings.Join(out, ", ")
}

func (e *routeEnv) router(t *testing.T, extra map[string]RouterPool,
	options RouterOptions) *Router {
	t.Helper()
	nodes := map[string]RouterPool{"a.test:5432": e.pools["a"], "b.test:5432": e.pools["b"]}
	for name, pool := range extra {
		nodes[name] = pool
	}
	if options.PlacementSQL == "" {
		options.PlacementSQL = fakePlacement
	}
	router, err := NewRouter(e.pools["default"], nodes, options)
	if err != nil {
		t.Fatal(err)
	}
	return router
}

// routedService is the middleware with router around a handler that writes an order.
func routedService(t *testing.T, router *Router) *httptest.Server {
	principalOf := func(r *http.Request) (string, bool) {
		who := r.Header.Get("X-User")
		return who, who != ""
	}
	handler := func(w http.ResponseWriter, r *http.Request) {
		state := FromContext(r.Context())
		var database string
		err := state.Tx.QueryRow(r.Context(), "INSERT INTO go_orders (principal, item)"+
			" VALUES ($1, 'book') RETURNING current_database()",
			state.Request.Principal).Scan(&database)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(201)
		_, _ = w.Write([]byte(database))
	}
	wrap := Middleware(MiddlewareOptions{Client: newClient(t, Options{}), Router: router,
		Principal: principalOf})
	server := httptest.NewServer(wrap(http.HandlerFunc(handler)))
	t.Cleanup(server.Close)
	return server
}

var routeKeys int64

// send posts a keyed request as who (key "": a fresh key); the status, replay header and body.
func send(t *testing.T, server *httptest.Server, who, key string) (int, string, string) {
	t.Helper()
	if key == "" {
		key = fmt.Sprintf("k-%d", atomic.AddInt64(&routeKeys, 1))
	}
	request, _ := http.NewRequest(http.MethodPost, server.URL+"/orders", strings.NewReader("{}"))
	request.Header.Set("X-User", who)
	request.Header.Set(KeyHeader, key)
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	body, _ := io.ReadAll(response.Body)
	if response.StatusCode != 201 {
		t.Fatalf("status %d: %s", response.StatusCode, body)
	}
	return response.StatusCode, response.Header.Get(ReplayHeader), string(body)
}

// countingPool counts the connects tried on a pool.
type countingPool struct {
	*pgxpool.Pool
	attempts *int64
}

func (c countingPool) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	atomic.AddInt64(c.attempts, 1)
	return c.Pool.Acquire(ctx)
}

// closedPort is a port on 127.0.0.1 where nothing listens.
func closedPort(t *testing.T) int {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := listener.Addr().(*net.TCPAddr).Port
	listener.Close()
	return port
}

func counters(lookups, failures, routed, defaulted, down int64) RouterCounters {
	return RouterCounters{Lookups: lookups, LookupFailures: failures, Routed: routed,
		Defaulted: defaulted, NodesMarkedDown: down}
}

func TestRouter(t *testing.T) {
	env := newRouteEnv(t)
	t.Run("PlacedPrincipalsRunOnTheirNode", func(t *testing.T) { routerPlaces(t, env) })
	t.Run("RefreshAndMove", func(t *testing.T) { routerRefreshes(t, env) })
	t.Run("NodeDown", func(t *testing.T) { routerNodeDown(t, env) })
	t.Run("LookupFailures", func(t *testing.T) { routerLookupFails(t, env) })
	t.Run("UnknownNode", func(t *testing.T) { routerUnknownNode(t, env) })
	t.Run("CacheBound", func(t *testing.T) { routerCacheBound(t, env) })
}

func routerPlaces(t *testing.T, env *routeEnv) {
	router := env.router(t, nil, RouterOptions{})
	server := routedService(t, router)
	p1, p2, p3 := principal(t), principal(t), principal(t)
	env.place(t, p1, "a.test")
	env.place(t, p2, "b.test")
	_, replayed, first := send(t, server, p1, "same")
	if first != env.names["a"] || replayed != "" {
		t.Fatalf("p1 ran in %s (replayed %q)", first, replayed)
	}
	send(t, server, p2, "")
	send(t, server, p3, "")
	if got := env.where(t, p1); got != "default 0/0, a 1/1, b 0/0" {
		t.Errorf("p1: %s", got)
	}
	if got := env.where(t, p2); got != "default 0/0, a 0/0, b 1/1" {
		t.Errorf("p2: %s", got)
	}
	if got := env.where(t, p3); got != "default 1/1, a 0/0, b 0/0" {
		t.Errorf("p3 (no placement): %s", got)
	}
	_, replayed, again := send(t, server, p1, "same") // the retry finds its key on node a
	if replayed != "true" || again != first || env.where(t, p1) != "default 0/0, a 1/1, b 0/0" {
		t.Errorf("retry: replayed %q, %s, %s", replayed, again, env.where(t, p1))
	}
	if got := router.Counters(); got != counters(3, 0, 3, 1, 0) {
		t.Errorf("counters %+v", got)
	}
}

func routerRefreshes(t *testing.T, env *routeEnv) {
	// Refresh is 1 s (not less): the three requests before it must fit in it on a
	// loaded machine.
	const refresh = time.Second
	router := env.router(t, nil, RouterOptions{Refresh: refresh})
	server, who := routedService(t, router), principal(t)
	env.place(t, who, "a.test")
	start := time.Now()
	send(t, server, who, "")
	send(t, server, who, "")
	if got := router.Counters().Lookups; got != 1 {
		t.Errorf("%d lookups: the second request should use the cache", got)
	}
	env.place(t, who, "b.test") // the shard moves
	send(t, server, who, "")    // stale: the old node, still correct
	if got := env.where(t, who); got != "default 0/0, a 3/3, b 0/0" {
		t.Errorf("before refresh: %s", got)
	}
	if time.Since(start) >= refresh {
		t.Fatalf("the machine is too slow for this test: %v for three requests", time.Since(start))
	}
	// The entry was cached after start and before now: it has expired after this sleep.
	time.Sleep(refresh + 50*time.Millisecond)
	send(t, server, who, "")
	if got := router.Counters().Lookups; got != 2 {
		t.Errorf("%d lookups: looked up again after Refresh", got)
	}
	if got := env.where(t, who); got != "default 0/0, a 3/3, b 1/1" {
		t.Errorf("after refresh: %s", got)
	}
}

func routerNodeDown(t *testing.T, env *routeEnv) {
	config, err := pgxpool.ParseConfig(env.dsn(env.names["a"], uint16(closedPort(t))))
	if err != nil {
		t.Fatal(err)
	}
	config.ConnConfig.ConnectTimeout = 2 * time.Second
	dead, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	var attempts int64
	router := env.router(t, map[string]RouterPool{"c.test:5432": countingPool{dead, &attempts}},
		RouterOptions{NodeDown: time.Second})
	server, who := routedService(t, router), principal(t)
	env.place(t, who, "c.test")
	send(t, server, who, "")
	if attempts != 1 || router.Counters().NodesMarkedDown != 1 {
		t.Fatalf("%d attempts, %+v", attempts, router.Counters())
	}
	send(t, server, who, "")
	if attempts != 1 {
		t.Errorf("a node marked down was tried (%d attempts)", attempts)
	}
	if got := router.Counters().Lookups; got != 2 {
		t.Errorf("%d lookups: the failure should drop the cached placement", got)
	}
	time.Sleep(time.Second + 50*time.Millisecond)
	send(t, server, who, "")
	if attempts != 2 || router.Counters().NodesMarkedDown != 2 {
		t.Errorf("after NodeDown: %d attempts, %+v", attempts, router.Counters())
	}
	if got := env.where(t, who); got != "default 3/3, a 0/0, b 0/0" {
		t.Errorf("rows: %s", got)
	}
	if got := router.Counters().Defaulted; got != 3 {
		t.Errorf("%d defaulted", got)
	}
}

func routerLookupFails(t *testing.T, env *routeEnv) {
	for _, c := range []struct {
		sql     string
		timeout time.Duration
	}{
		{"SELECT node_name, node_port FROM no_such_table WHERE principal = $1", 0},
		{"SELECT node_name, node_port FROM go_route_fake, pg_sleep(2) WHERE principal = $1",
			150 * time.Millisecond},
	} {
		router := env.router(t, nil, RouterOptions{PlacementSQL: c.sql, LookupTimeout: c.timeout})
		server, who := routedService(t, router), principal(t)
		env.place(t, who, "a.test")
		send(t, server, who, "")
		send(t, server, who, "")
		if got := router.Counters(); got != counters(2, 2, 0, 2, 0) {
			t.Errorf("%s: counters %+v", c.sql, got)
		}
		if got := env.where(t, who); got != "default 2/2, a 0/0, b 0/0" {
			t.Errorf("%s: %s", c.sql, got)
		}
	}
}

func routerUnknownNode(t *testing.T, env *routeEnv) {
	router := env.router(t, nil, RouterOptions{})
	server, who := routedService(t, router), principal(t)
	env.place(t, who, "z.test")
	send(t, server, who, "")
	if got := env.where(t, who); got != "default 1/1, a 0/0, b 0/0" {
		t.Errorf("rows: %s", got)
	}
	if got := router.Counters(); got != counters(1, 0, 0, 1, 0) {
		t.Errorf("counters %+v", got)
	}
}

func routerCacheBound(t *testing.T, env *routeEnv) {
	router := env.router(t, nil, RouterOptions{MaxPrincipals: 2})
	ctx := context.Background()
	p1, p2, p3 := principal(t), principal(t), principal(t)
	env.place(t, p1, "a.test")
	if node, _ := router.Route(ctx, p1); node != "a.test:5432" {
		t.Fatalf("p1 on %q", node)
	}
	router.Route(ctx, p2)
	router.Route(ctx, p1) // p1 used last: p2 is the oldest
	router.Route(ctx, p3)
	if router.Len() != 2 || router.Counters().Lookups != 3 {
		t.Fatalf("%d cached, %+v", router.Len(), router.Counters())
	}
	router.Route(ctx, p1)
	if router.Counters().Lookups != 3 {
		t.Errorf("p1 should have stayed")
	}
	router.Route(ctx, p2)
	if router.Counters().Lookups != 4 {
		t.Errorf("p2 should have been evicted")
	}
	// Concurrent requests of one principal share one lookup.
	p4 := principal(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); router.Route(ctx, p4) }()
	}
	wg.Wait()
	if router.Counters().Lookups != 5 {
		t.Errorf("%d lookups for p4's 8 concurrent routes", router.Counters().Lookups-4)
	}
}

func TestRouterRefusesBadSettings(t *testing.T) {
	pool := newPool(t)
	if _, err := NewRouter(pool, map[string]RouterPool{"a.test": pool},
		RouterOptions{}); err == nil {
		t.Error("a node name without a port was accepted")
	}
	if _, err := NewRouter(pool, nil, RouterOptions{MaxPrincipals: -1}); err == nil {
		t.Error("MaxPrincipals -1 was accepted")
	}
	if _, err := NewRouter(nil, nil, RouterOptions{}); err == nil {
		t.Error("no default pool was accepted")
	}
	router, _ := NewRouter(pool, nil, RouterOptions{})
	client := newClient(t, Options{})
	who := func(*http.Request) (string, bool) { return "", false }
	for _, options := range []MiddlewareOptions{
		{Client: client, Principal: who},
		{Client: client, Principal: who, Router: router, Connections: FromPool(pool)},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Middleware accepted %+v", options)
				}
			}()
			Middleware(options)
		}()
	}
}

// A Router built with zero options takes the routing defaults (generated from
// client/protocol.json, protocol_gen.go).
func TestRouterDefaultsAreTheTables(t *testing.T) {
	router, err := NewRouter(nilPool{}, nil, RouterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := router.Options()
	want := RouterOptions{PlacementSQL: PlacementSQL, Refresh: DefaultRefreshSeconds * time.Second,
		NodeDown: DefaultNodeDownSeconds * time.Second, MaxPrincipals: DefaultMaxPrincipals,
		LookupTimeout: DefaultLookupTimeout}
	if got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
}

// nilPool is a RouterPool that is never used.
type nilPool struct{}

func (nilPool) Acquire(context.Context) (*pgxpool.Conn, error) { return nil, errors.New("unused") }

func (nilPool) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("unused")
}
