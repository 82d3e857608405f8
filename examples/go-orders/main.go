// go-orders: the orders service of examples/orders-service in Go (net/http,
// pgx v5), idempotent through pg_idempotency's middleware (client/go).
//
//	go-orders --port 8080 --dsn "host=... dbname=..." [--threads 8]
//
// Same routes, bodies and headers as the C++ and Python services:
//
//	POST /orders          {"item": "...", "quantity": n}; Idempotency-Key;
//	                      Authorization: Bearer <principal>; ?delay_ms=N slows the handler
//	POST /reject/orders   the same in reject mode: a duplicate of a running request
//	                      gets 409 with Retry-After at once instead of waiting
//	POST /plain/orders    the same handler without the middleware (baseline)
//	POST /classic/orders  the same as /orders
//	POST /flaky/orders    the first run for each (principal, key) inserts the order,
//	                      then answers 500: rolled back, not stored, the retry runs again
//	POST /orders/stream   {"chunks": n, "chunk_bytes": m}: one order, then 200 text/plain
//	                      streamed as n flushed chunks of m bytes (chunk i: digit i % 10);
//	                      kept up to 65536 bytes, a retry of a longer one gets 409
//	POST /river/orders    the same order, inserted with sqlc-shaped queries (ordersdb) and
//	                      with a River job (order_created) by InsertTx, both in the
//	                      transaction that holds the key; the body adds "job" (its id)
//	POST /api-keys        {"name": "..."}: the secret is answered once (one_time_secret)
//	GET  /orders/count    {"orders": n}
//	GET  /health          ok
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	idempotency "github.com/pg-idempotency/pg-idempotency/client/go"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// schema is the example's tables, the file sqlc reads too.
//
//go:embed ordersdb/schema.sql
var schema string

func main() {
	port := flag.Int("port", 8080, "HTTP port on 127.0.0.1")
	dsn := flag.String("dsn", "", "libpq connection string of the database")
	threads := flag.Int("threads", 8, "database connections")
	flag.Parse()
	if err := serve(*port, *dsn, *threads); err != nil {
		fmt.Fprintln(os.Stderr, "go-orders:", err)
		os.Exit(1)
	}
}

func serve(port int, dsn string, connections int) error {
	ctx := context.Background()
	config, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	config.MaxConns = int32(connections)
	// pgxpool makes connections when needed, so the service starts while its database
	// is down (or restarting) and serves when it is back; the tables are made then.
	// For a few seconds after a database fault, a connection is pinged before it is
	// handed out (a restart ended the idle ones too; pgx sees that only when used).
	var lastFault int64
	config.PrepareConn = func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		if time.Since(time.Unix(0, atomic.LoadInt64(&lastFault))) > 5*time.Second {
			return true, nil
		}
		return conn.Ping(ctx) == nil, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return err
	}
	defer pool.Close()
	jobsConfig := config.Copy()
	jobsConfig.MaxConns = 4
	jobsPool, err := pgxpool.NewWithConfig(ctx, jobsConfig)
	if err != nil {
		return err
	}
	defer jobsPool.Close()
	jobs, err := newJobs(jobsPool, pool)
	if err != nil {
		return err
	}
	go prepare(ctx, pool, jobs)
	client, err := idempotency.NewClient(idempotency.Options{})
	if err != nil {
		return err
	}
	options := idempotency.MiddlewareOptions{
		Client:      client,
		Connections: idempotency.FromPool(pool),
		Principal:   principalOf,
		Applies:     func(r *http.Request) bool { return r.Method == http.MethodPost },
		// POST /orders/stream: a longer stream is sent once and not kept.
		MaxStreamBytes: 65536,
		OnError: func(r *http.Request, err error) {
			fmt.Fprintf(os.Stderr, "go-orders: %s %s: %v\n", r.Method, r.URL.Path, err)
			if idempotency.IsDatabaseFault(err) {
				atomic.StoreInt64(&lastFault, time.Now().UnixNano())
			}
		},
	}
	s := &service{pool: pool, jobs: jobs, flakyFailed: map[[2]string]bool{}}
	address := fmt.Sprintf("127.0.0.1:%d", port)
	fmt.Fprintln(os.Stderr, "go-orders: listening on", address)
	return http.ListenAndServe(address, s.routes(options))
}

// routes are the service's routes, keyed ones behind the middleware of options.
func (s *service) routes(options idempotency.MiddlewareOptions) http.Handler {
	keyed := idempotency.Middleware(options)
	// The same Client and pool on a route of its own in reject mode: a duplicate
	// gets 409 at once.
	options.Route = idempotency.Route{Wait: idempotency.Reject}
	rejecting := idempotency.Middleware(options)
	routes := http.NewServeMux()
	routes.HandleFunc("/health", s.health)
	routes.HandleFunc("/orders/count", s.count)
	routes.Handle("/orders", keyed(http.HandlerFunc(s.orders)))
	routes.Handle("/reject/orders", rejecting(http.HandlerFunc(s.orders)))
	routes.Handle("/classic/orders", keyed(http.HandlerFunc(s.orders)))
	routes.Handle("/flaky/orders", keyed(http.HandlerFunc(s.flakyOrders)))
	routes.Handle("/api-keys", keyed(http.HandlerFunc(s.apiKeys)))
	routes.Handle("/orders/stream", keyed(http.HandlerFunc(s.streamOrders)))
	routes.Handle("/river/orders", keyed(http.HandlerFunc(s.riverOrders)))
	routes.HandleFunc("/plain/orders", s.plainOrders)
	routes.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		send(w, problem(404, "Not found", "No such route."))
	})
	return routes
}

// prepare makes River's tables and the example's once the database answers,
// retrying every second, then starts River's workers and periodic jobs.
func prepare(ctx context.Context, pool *pgxpool.Pool, jobs *river.Client[pgx.Tx]) {
	for {
		err := setup(ctx, pool)
		if err == nil {
			err = jobs.Start(ctx)
		}
		if err == nil {
			return
		}
		fmt.Fprintf(os.Stderr, "go-orders: cannot prepare the database yet (%v); retrying\n", err)
		time.Sleep(time.Second)
	}
}

// setup runs River's migrations (rivermigrate), then makes the example's tables:
// once orders exists, River's tables do too.
func setup(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrateRiver(ctx, pool); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, schema)
	return err
}

// principalOf is the bearer token: the example's whole authentication.
func principalOf(r *http.Request) (string, bool) {
	auth := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(auth) > len(prefix) && strings.HasPrefix(auth, prefix) {
		return auth[len(prefix):], true
	}
	return "", false
}
