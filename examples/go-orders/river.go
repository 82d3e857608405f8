package main

// River (github.com/riverqueue/river, driver riverpgxv5): the job queue of a pgx v5
// service. POST /river/orders inserts its order row (sqlc-shaped queries, ordersdb)
// and an order_created job with InsertTx, both in the transaction that holds the
// request's key: the job exists exactly when the request's effect committed (a
// 5xx, a non-final answer, or a final error rolls it back with the order; a
// replay runs nothing). The key table's cleanup runs as a River periodic job,
// beside idempotency.schedule_cleanup (pg_cron) for services without River.

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	idempotency "github.com/pg-idempotency/pg-idempotency/client/go"
	"github.com/pg-idempotency/pg-idempotency/examples/go-orders/ordersdb"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// orderCreated is the job of a new order: its confirmation (here a log line).
type orderCreated struct {
	OrderID   int64  `json:"order_id"`
	Principal string `json:"principal"`
}

// Kind is the job's kind in river_job.
func (orderCreated) Kind() string { return "order_created" }

type orderCreatedWorker struct {
	river.WorkerDefaults[orderCreated]
}

// Work confirms the order.
func (orderCreatedWorker) Work(ctx context.Context, job *river.Job[orderCreated]) error {
	fmt.Fprintf(os.Stderr, "go-orders: order %d of %s confirmed\n", job.Args.OrderID,
		job.Args.Principal)
	return nil
}

// keyCleanup is the periodic job that deletes expired keys.
type keyCleanup struct{}

// Kind is the job's kind in river_job.
func (keyCleanup) Kind() string { return "idempotency_cleanup" }

// keyCleanupWorker runs the extension's cleanup procedure: batches, committed
// one by one, for at most 50 seconds (what schedule_cleanup's pg_cron job runs).
type keyCleanupWorker struct {
	river.WorkerDefaults[keyCleanup]
	pool *pgxpool.Pool
}

// Work deletes expired keys.
func (w keyCleanupWorker) Work(ctx context.Context, job *river.Job[keyCleanup]) error {
	_, err := w.pool.Exec(ctx, "CALL idempotency.cleanup(max_runtime => '50 seconds')")
	return err
}

// newJobs is the service's River client on its own small pool (River's listener
// and producers do not take the HTTP pool's connections); jobs are inserted with
// InsertTx on the request's transaction, whichever pool that came from.
func newJobs(jobsPool, appPool *pgxpool.Pool) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, orderCreatedWorker{})
	river.AddWorker(workers, keyCleanupWorker{pool: appPool})
	cleanup := river.NewPeriodicJob(river.PeriodicInterval(time.Minute),
		func() (river.JobArgs, *river.InsertOpts) {
			// One cleanup a minute however many services run: River's leader inserts it,
			// and ByPeriod keeps a second one of the same minute out. RunOnStart: a
			// new leader runs one at once.
			return keyCleanup{}, &river.InsertOpts{
				UniqueOpts: river.UniqueOpts{ByPeriod: time.Minute}}
		}, &river.PeriodicJobOpts{ID: "idempotency:cleanup", RunOnStart: true})
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return river.NewClient(riverpgxv5.New(jobsPool), &river.Config{
		Logger:       logger,
		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:      workers,
		PeriodicJobs: []*river.PeriodicJob{cleanup},
	})
}

// migrateRiver makes or updates River's tables (river_job and the others).
func migrateRiver(ctx context.Context, pool *pgxpool.Pool) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

// createQueuedOrder validates the body, inserts the order with the sqlc-shaped
// queries and enqueues its order_created job, all in tx.
func (s *service) createQueuedOrder(ctx context.Context, tx pgx.Tx, principal string,
	body []byte) (result, string) {
	item, quantity, invalid := parseOrder(body)
	if invalid != nil {
		return *invalid, ""
	}
	order, err := ordersdb.New(tx).CreateOrder(ctx, ordersdb.CreateOrderParams{
		Principal: principal, Item: item, Quantity: int32(quantity)})
	if err != nil {
		return internalError(err), ""
	}
	job, err := s.jobs.InsertTx(ctx, tx, orderCreated{OrderID: order.ID, Principal: principal}, nil)
	if err != nil {
		return internalError(err), ""
	}
	id := strconv.FormatInt(order.ID, 10)
	document := map[string]any{"id": order.ID, "item": order.Item, "quantity": order.Quantity,
		"created_at": order.CreatedAt.Time.UTC().Format(time.RFC3339Nano), "job": job.Job.ID}
	headers := idempotency.Headers{{Name: "Content-Type", Value: "application/json"},
		{Name: "Location", Value: "/orders/" + id}}
	return result{201, headers, dumps(document)}, id
}

// riverOrders is POST /river/orders: createQueuedOrder in the key's transaction.
func (s *service) riverOrders(w http.ResponseWriter, r *http.Request) {
	state, body, ok := keyedCall(w, r)
	if !ok {
		return
	}
	answer, id := s.createQueuedOrder(r.Context(), state.Tx, state.Request.Principal, body)
	state.ResourceID = id
	send(w, answer)
}
