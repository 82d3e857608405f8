package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"

	idempotency "github.com/pg-idempotency/pg-idempotency/client/go"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// service holds the pool, River's client and the flaky route's memory.
type service struct {
	pool        *pgxpool.Pool
	jobs        *river.Client[pgx.Tx]
	flakyMu     sync.Mutex
	flakyFailed map[[2]string]bool
}

// result is one HTTP answer of a business handler.
type result struct {
	status  int
	headers idempotency.Headers
	body    []byte
}

func send(w http.ResponseWriter, r result) {
	idempotency.WriteResponse(w, idempotency.Response{Status: r.status, Headers: r.headers,
		Body: r.body})
}

// dumps is compact JSON with sorted members: the bytes nlohmann_json writes in
// the C++ service (encoding/json sorts map keys; HTML escaping off).
func dumps(document map[string]any) []byte {
	var b bytes.Buffer
	encoder := json.NewEncoder(&b)
	encoder.SetEscapeHTML(false)
	_ = encoder.Encode(document)
	return bytes.TrimRight(b.Bytes(), "\n")
}

func problem(status int, title, detail string) result {
	return result{status, idempotency.Headers{{Name: "Content-Type",
		Value: idempotency.ProblemContentType}},
		idempotency.ProblemBody(status, "about:blank", title, detail)}
}

// internalError answers an error of the database: the one fault answer for a
// database fault (a keyed route's is replaced by the middleware's anyway), else a
// 500 that does not show the driver's text; the error itself goes to the log.
func internalError(err error) result {
	fmt.Fprintln(os.Stderr, "go-orders:", err)
	if idempotency.IsDatabaseFault(err) {
		fault := idempotency.DatabaseFaultResponse(idempotency.DefaultRetryAfterSeconds, "")
		return result{fault.Status, fault.Headers, fault.Body}
	}
	return problem(500, "Internal error", "The request failed; it is safe to retry with the same key.")
}

func (s *service) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte("ok"))
}

func (s *service) count(w http.ResponseWriter, r *http.Request) {
	var n int64
	if err := s.pool.QueryRow(r.Context(), "SELECT count(*) FROM orders").Scan(&n); err != nil {
		send(w, internalError(err))
		return
	}
	send(w, result{200, idempotency.Headers{{Name: "Content-Type", Value: "application/json"}},
		dumps(map[string]any{"orders": n})})
}

// keyedCall is what a keyed route has: the middleware's context and the body,
// or the answer when the request cannot reach the handler.
func keyedCall(w http.ResponseWriter, r *http.Request) (*idempotency.RequestContext, []byte, bool) {
	state := idempotency.FromContext(r.Context())
	if r.Method != http.MethodPost {
		send(w, problem(404, "Not found", "No such route."))
		return nil, nil, false
	}
	if state == nil { // the middleware passes requests without a principal through
		send(w, problem(401, "Unauthorized", "Send Authorization: Bearer <token>."))
		return nil, nil, false
	}
	body, _ := io.ReadAll(r.Body)
	return state, body, true
}

func (s *service) orders(w http.ResponseWriter, r *http.Request) {
	state, body, ok := keyedCall(w, r)
	if !ok {
		return
	}
	answer, id := createOrder(r.Context(), state.Tx, state.Request.Principal, body, delayMs(r))
	state.ResourceID = id
	send(w, answer)
}

func (s *service) flakyOrders(w http.ResponseWriter, r *http.Request) {
	state, body, ok := keyedCall(w, r)
	if !ok {
		return
	}
	answer, id := createOrder(r.Context(), state.Tx, state.Request.Principal, body, delayMs(r))
	state.ResourceID = id
	if answer.status < 300 && s.firstRun(state.Request.Principal, state.Request.Key) {
		answer = problem(500, "Internal error",
			"The request failed; it is safe to retry with the same key.")
	}
	send(w, answer)
}

func (s *service) firstRun(principal, key string) bool {
	s.flakyMu.Lock()
	defer s.flakyMu.Unlock()
	if s.flakyFailed[[2]string{principal, key}] {
		return false
	}
	s.flakyFailed[[2]string{principal, key}] = true
	return true
}

func (s *service) apiKeys(w http.ResponseWriter, r *http.Request) {
	state, body, ok := keyedCall(w, r)
	if !ok {
		return
	}
	answer, id := createAPIKey(r.Context(), state.Tx, state.Request.Principal, body)
	state.ResourceID = id
	state.OneTimeSecret = answer.status < 300
	send(w, answer)
}

// plainOrders is the same handler in a plain transaction, without the
// middleware: the baseline of bench/http/languages.sh.
func (s *service) plainOrders(w http.ResponseWriter, r *http.Request) {
	principal, ok := principalOf(r)
	if r.Method != http.MethodPost {
		send(w, problem(404, "Not found", "No such route."))
		return
	}
	if !ok {
		send(w, problem(401, "Unauthorized", "Send Authorization: Bearer <token>."))
		return
	}
	body, _ := io.ReadAll(r.Body)
	var answer result
	err := pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		answer, _ = createOrder(r.Context(), tx, principal, body, delayMs(r))
		if answer.status >= 300 {
			return errRollback
		}
		return nil
	})
	if err != nil && err != errRollback {
		answer = internalError(err)
	}
	send(w, answer)
}

type rollback struct{}

// Error says the transaction was rolled back on purpose.
func (rollback) Error() string { return "rolled back" }

var errRollback error = rollback{}

func delayMs(r *http.Request) int {
	delay, err := strconv.Atoi(r.URL.Query().Get("delay_ms"))
	if err != nil || delay < 0 {
		return 0
	}
	return delay
}

// randomSecret is a new API key's secret: "sk_" and 32 hex digits.
func randomSecret() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "sk_" + hex.EncodeToString(b[:])
}
