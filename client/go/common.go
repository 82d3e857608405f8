package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Request is one HTTP request as the protocol sees it.
type Request struct {
	// Principal is whoever the key belongs to (user, API key, tenant), from
	// authentication, never from the body.
	Principal string
	// Key is the Idempotency-Key header; "" means the request had none (an
	// empty header is answered as a missing one).
	Key string
	// Method is the HTTP method, compared in upper case.
	Method string
	// Path is the request path (without the query string, unless the API wants
	// it fingerprinted).
	Path string
	// Body is fingerprinted as RFC 8785 JSON when it is JSON, as raw bytes otherwise.
	Body []byte
	// Exclude lists RFC 6901 pointers of members left out of the fingerprint.
	Exclude []string
	// Action is the operation name stored with the key; "" means "METHOD path".
	Action string
	// Route holds this call's TTL, Wait and MethodsRequiringKey; its zero values
	// keep the Client's (route.go).
	Route Route
}

// ActionName is the action stored with the key.
func (r Request) ActionName() string {
	if r.Action != "" {
		return r.Action
	}
	return strings.ToUpper(r.Method) + " " + r.Path
}

// validKey: 1 to maxLength visible ASCII characters (space included), as the
// C++ and Python clients check before asking the server.
func validKey(key string, maxLength int) bool {
	if len(key) == 0 || len(key) > maxLength {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// interval is a duration as a query argument: nil (the server's setting) for 0.
func interval(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return d
}

// excludeArg is the exclude pointers as a query argument: nil when there are none.
func excludeArg(pointers []string) any {
	if len(pointers) == 0 {
		return nil
	}
	return pointers
}

// SQLSTATEs the clients map to HTTP answers instead of returning them.
const (
	// The server refuses a key it cannot accept (empty, too long, not a UUID
	// when idempotency.key_format asks) with 22P02.
	stateKeyRefused = "22P02"
	// The body cannot be fingerprinted (JSON nested deeper than the limit).
	stateBodyTooDeep  = "54000"
	stateBodyTooDeep2 = "54001"
)

// sqlState is the SQLSTATE of a server error, "" for any other error.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Retryable reports a serialization failure (40001) or a deadlock (40P01): the
// transaction was rolled back by the server and may run again as a whole.
func Retryable(err error) bool {
	state := sqlState(err)
	return state == "40001" || state == "40P01"
}

const finalStatusesSQL = "SELECT s FROM pg_catalog.generate_series(100, 599) AS s" +
	" WHERE idempotency.is_final(s)"

// finalStatuses says which statuses are stored: idempotency.is_final, read once
// per client, or a fixed list.
type finalStatuses struct {
	mu     sync.Mutex
	loaded bool
	table  [500]bool
}

func newFinalStatuses(statuses []int) (*finalStatuses, error) {
	f := &finalStatuses{}
	if statuses == nil {
		return f, nil
	}
	for _, status := range statuses {
		if status < 100 || status > 599 {
			return nil, fmt.Errorf("idempotency: not an HTTP status: %d", status)
		}
		f.table[status-100] = true
	}
	f.loaded = true
	return f, nil
}

// Querier is what ClaimBatch (and the final-status table) needs: a pgx.Tx, a
// *pgx.Conn or a *pgxpool.Pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// load reads the server's idempotency.final_statuses (one round trip, once).
func (f *finalStatuses) load(ctx context.Context, q Querier) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loaded {
		return nil
	}
	rows, err := q.Query(ctx, finalStatusesSQL)
	if err != nil {
		return err
	}
	statuses, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return err
	}
	for _, status := range statuses {
		f.table[status-100] = true // generate_series(100, 599): in range
	}
	f.loaded = true
	return nil
}

// final reports whether a response with this status is stored (after load).
func (f *finalStatuses) final(status int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return status >= 100 && status <= 599 && f.table[status-100]
}
