package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Many keys in one call: idempotency.begin_batch, complete_batch and
// claim_batch (extension 0.8.0). Each key behaves as the single-key call; the
// server takes the key locks in sorted key order, so two batches never
// deadlock. The fingerprints are computed by the server in the same statement.
const (
	// Each key's answer (but a started one's) from idempotency.http_answer, as beginSQL's.
	beginBatchSQL = "SELECT b.ord, b.key, b.outcome, coalesce(b.response_status, 0)," +
		" coalesce(b.resource_id, ''), CASE WHEN isfinite(b.created_at) THEN b.created_at END," +
		" CASE WHEN isfinite(b.expires_at) THEN b.expires_at END, coalesce(b.fence, 0)," +
		" CASE WHEN isfinite(b.lease_until) THEN b.lease_until END," +
		" a.status, a.headers::text, a.body" +
		" FROM idempotency.begin_batch($1, $2::text[], $3," +
		" ARRAY(SELECT idempotency.fingerprint(u.m, u.p, u.b, $7::text[])" +
		" FROM unnest($4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS u(m, p, b, n)" +
		" ORDER BY u.n), $8::interval, $9::interval) AS b" +
		" LEFT JOIN LATERAL (SELECT * FROM idempotency.http_answer(b, $10::text, $11::integer)" +
		" WHERE b.outcome <> 'started' OFFSET 0) AS a ON true ORDER BY b.ord"
	completeBatchSQL = "SELECT ord, key, completed FROM idempotency.complete_batch($1," +
		" $2::text[], $3::integer[], $4::bytea[], $5::text[]::jsonb[], $6::text[]) ORDER BY ord"
	claimBatchSQL = "SELECT ord, key, claimed FROM idempotency.claim_batch($1, $2::text[]," +
		" $3::interval) ORDER BY ord"
)

// BatchOutcome is what begin_batch answered for one key: the columns of
// idempotency.batch_outcome, Outcome spelled as begin's.
type BatchOutcome struct {
	// Ord is the key's 1-based position in the batch; Key the key.
	Ord int
	Key string
	// Outcome is "started" (run the work, then CompleteBatch), "replay",
	// "mismatch", "in_progress" or "secret_replay", as Client.Handle's begin.
	Outcome string
	// Response is the answer for an outcome that does not run the work, made
	// as Client.Handle makes it (stored response, 409, 422, with
	// Idempotency-Expires); nil for "started".
	Response *Response
	// Status, ResourceID: of the stored response (0, "" when there is none).
	Status     int
	ResourceID string
	// CreatedAt, ExpiresAt, LeaseUntil: the key row's; zero when NULL.
	CreatedAt, ExpiresAt, LeaseUntil time.Time
	// Fence is the key row's fence (0 when it has none).
	Fence int64
}

// Started reports whether this key is now held by the transaction.
func (o BatchOutcome) Started() bool { return o.Outcome == "started" }

// BatchCompletion is what complete_batch answered for one key.
type BatchCompletion struct {
	Ord       int    // the key's 1-based position in the batch
	Key       string // the key
	Completed bool   // complete_batch stored the response (as complete's true)
}

// BatchClaim is what claim_batch answered for one key: Claimed is true for
// the call that claimed it, as idempotency.claim.
type BatchClaim struct {
	Ord     int    // the key's 1-based position in the batch
	Key     string // the key
	Claimed bool   // this call claimed it
}

// batchShape checks what one batch call can carry: one principal, one action,
// one exclude list, one TTL and one Wait, and a key for every request.
func batchShape(reqs []Request) error {
	first := reqs[0]
	for i, req := range reqs {
		switch {
		case req.Key == "":
			return fmt.Errorf("idempotency: batch request %d has no key", i+1)
		case req.Principal != first.Principal:
			return errors.New("idempotency: a batch has one principal")
		case req.ActionName() != first.ActionName():
			return errors.New("idempotency: a batch has one action")
		case req.Route.Wait != first.Route.Wait || req.Route.TTL != first.Route.TTL:
			return errors.New("idempotency: a batch has one TTL and one Wait")
		case fmt.Sprint(req.Exclude) != fmt.Sprint(first.Exclude):
			return errors.New("idempotency: a batch has one exclude list")
		}
	}
	return nil
}

// BeginBatch claims the keys of reqs inside the caller's transaction tx, in
// one round trip (idempotency.begin_batch), and returns one outcome per
// request in their order. Run the work of the "started" keys in tx, then
// CompleteBatch them before committing. The requests share one principal,
// action, exclude list and Route (TTL and Wait over the client's), and
// its Counters count the answers (replay, mismatch, ...) as Handle's.
// The server refuses a duplicate key (22023) and more than 1000 keys (54000).
func (c *Client) BeginBatch(ctx context.Context, tx pgx.Tx, reqs []Request) ([]BatchOutcome,
	error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if err := batchShape(reqs); err != nil {
		return nil, err
	}
	n := len(reqs)
	keys, methods, paths, bodies := make([]string, n), make([]string, n), make([]string, n),
		make([][]byte, n)
	for i, req := range reqs {
		keys[i], methods[i], paths[i], bodies[i] = req.Key, req.Method, req.Path, req.Body
	}
	first := reqs[0]
	route, err := c.options.route(first.Route)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, beginBatchSQL, first.Principal, keys, first.ActionName(), methods,
		paths, bodies, excludeArg(first.Exclude), interval(route.TTL), route.Wait.arg(),
		c.options.ProblemTypeBase, c.options.RetryAfter)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, c.scanBatchOutcome)
}

// scanBatchOutcome reads one row of beginBatchSQL, its answer http_answer's.
func (c *Client) scanBatchOutcome(rows pgx.CollectableRow) (BatchOutcome, error) {
	var o BatchOutcome
	var row answerRow
	var created, expires, lease *time.Time
	if err := rows.Scan(&o.Ord, &o.Key, &o.Outcome, &o.Status, &o.ResourceID, &created, &expires,
		&o.Fence, &lease, &row.status, &row.headers, &row.body); err != nil {
		return o, err
	}
	row.resourceID = &o.ResourceID
	for _, t := range []struct{ from, to *time.Time }{{created, &o.CreatedAt},
		{expires, &o.ExpiresAt}, {lease, &o.LeaseUntil}} {
		if t.from != nil {
			*t.to = *t.from
		}
	}
	if o.Started() {
		return o, nil
	}
	c.count(o.Outcome)
	response := row.response()
	o.Response = &response
	return o, nil
}

// CompleteBatch stores the final responses of keys that BeginBatch started in
// tx (idempotency.complete_batch), one round trip; commit tx afterwards.
// responses[i] answers reqs[i]; the client's KeptHeaders are stored. Every
// status must be final (else 22023, nothing stored); a one-time secret cannot
// be completed in a batch (use Handle). Returns one completion per request.
func (c *Client) CompleteBatch(ctx context.Context, tx pgx.Tx, reqs []Request,
	responses []Response) ([]BatchCompletion, error) {
	if len(reqs) != len(responses) {
		return nil, fmt.Errorf("idempotency: %d requests and %d responses", len(reqs),
			len(responses))
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	n := len(reqs)
	keys, statuses, bodies := make([]string, n), make([]int32, n), make([][]byte, n)
	headers, resources := make([]string, n), make([]*string, n)
	for i, req := range reqs {
		response := responses[i]
		switch {
		case req.Key == "":
			return nil, fmt.Errorf("idempotency: batch request %d has no key", i+1)
		case req.Principal != reqs[0].Principal:
			return nil, errors.New("idempotency: a batch has one principal")
		case response.OneTimeSecret:
			return nil, errors.New("idempotency: a one-time secret cannot be completed in a batch")
		}
		keys[i], statuses[i], bodies[i] = req.Key, int32(response.Status), nonNil(response.Body)
		headers[i] = keptHeadersJSON(response, c.options.KeptHeaders)
		if response.ResourceID != "" {
			resources[i] = &responses[i].ResourceID
		}
	}
	rows, err := tx.Query(ctx, completeBatchSQL, reqs[0].Principal, keys, statuses, bodies,
		headers, resources)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[BatchCompletion])
}

// ClaimBatch claims many keys at once (idempotency.claim_batch): Claimed is
// true for each key this call claimed within ttl (0: idempotency.key_ttl), as
// idempotency.claim would answer. On a transaction the claims commit or roll
// back with it; on a connection or pool the call commits on its own.
func ClaimBatch(ctx context.Context, q Querier, principal string, keys []string,
	ttl time.Duration) ([]BatchClaim, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, claimBatchSQL, principal, keys, interval(ttl))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[BatchClaim])
}
