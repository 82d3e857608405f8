package idempotency

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The key's expiry header (Idempotency-Expires) and wait-or-reject per call:
// the table's values (client/protocol.json) and the behaviour on a live database.

func TestHTTPDateIsAnIMFFixdate(t *testing.T) {
	if got := HTTPDate(784111777); got != "Sun, 06 Nov 1994 08:49:37 GMT" { // RFC 9110's example
		t.Errorf("HTTPDate: %q", got)
	}
}

// protocolOutcome is one outcome of client/protocol.json (what the tests expect
// of idempotency.http_answer's answers).
func protocolOutcome(t *testing.T, name string) struct{ Problem, Detail string } {
	t.Helper()
	text, err := os.ReadFile("../protocol.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Outcomes map[string]struct{ Problem, Detail string } `json:"outcomes"`
	}
	if err := json.Unmarshal(text, &file); err != nil {
		t.Fatal(err)
	}
	return file.Outcomes[name]
}

func expiryValues(r Response) []string {
	var values []string
	for _, field := range r.Headers {
		if strings.EqualFold(field.Name, ExpiresHeader) {
			values = append(values, field.Value)
		}
	}
	return values
}

func storedExpiry(t *testing.T, who, key string) []string {
	t.Helper()
	epoch := scalarInt(t, "SELECT floor(extract(epoch FROM expires_at))::bigint"+
		" FROM idempotency.lookup($1, $2)", who, key)
	return []string{HTTPDate(epoch)}
}

// withOwnExpiry sets the header in the handler too: the client's value replaces it.
func withOwnExpiry(handler Handler) Handler {
	return func(ctx context.Context, tx pgx.Tx) (Response, error) {
		response, err := handler(ctx, tx)
		response.Headers = append(response.Headers, HeaderField{ExpiresHeader, "handler's own"})
		return response, err
	}
}

func TestExpiryIsTheStoredRowsOnFirstAnswerReplayAnd422(t *testing.T) {
	ordersTable(t)
	ctx, who, calls := context.Background(), principal(t), 0
	client := newClient(t, Options{KeptHeaders: append([]string{ExpiresHeader},
		DefaultKeptHeaders...)})
	conn := connect(t)
	first, err := client.Handle(ctx, conn, orderRequest(who, "exp", order),
		withOwnExpiry(createOrder(who, 201, &calls)))
	if err != nil || !reflect.DeepEqual(expiryValues(first), storedExpiry(t, who, "exp")) {
		t.Fatalf("first: %v %v", first.Headers, err)
	}
	if n := scalarInt(t, "SELECT count(*) FROM idempotency.keys WHERE principal = $1"+
		" AND response_headers::text ILIKE '%'||$2||'%'", who, ExpiresHeader); n != 0 {
		t.Errorf("the expiry header was stored")
	}
	time.Sleep(1100 * time.Millisecond) // a recomputed value would move by a second
	retry, err := client.Handle(ctx, conn, orderRequest(who, "exp", orderRespelled),
		createOrder(who, 201, &calls))
	if err != nil || !retry.Replayed || !reflect.DeepEqual(expiryValues(retry),
		expiryValues(first)) {
		t.Errorf("replay: %v %v", retry.Headers, err)
	}
	other, err := client.Handle(ctx, conn, orderRequest(who, "exp", "{}"),
		createOrder(who, 201, &calls))
	if err != nil || other.Status != 422 || !reflect.DeepEqual(expiryValues(other),
		expiryValues(first)) {
		t.Errorf("422: %d %v %v", other.Status, other.Headers, err)
	}
	stored, err := client.Handle(ctx, conn, orderRequest(who, "exp-409", order),
		createOrder(who, 409, &calls))
	if err != nil || !reflect.DeepEqual(expiryValues(stored), storedExpiry(t, who, "exp-409")) {
		t.Errorf("stored 409: %v %v", stored.Headers, err)
	}
}

func TestRejectIs409AtOnce(t *testing.T) {
	ordersTable(t)
	for _, where := range []string{"options", "request"} {
		ctx, who, calls := context.Background(), principal(t), 0
		holder := connect(t)
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var outcome string
		err = tx.QueryRow(ctx, "SELECT outcome FROM idempotency.begin($1, 'rej', 'test',"+
			" idempotency.fingerprint('POST', '/orders', $2::bytea))", who,
			[]byte(order)).Scan(&outcome)
		if err != nil || outcome != "started" {
			t.Fatalf("holder: %s %v", outcome, err)
		}
		options, request := Options{Wait: WaitUpTo(3 * time.Second)}, orderRequest(who, "rej", order)
		if where == "options" {
			options.Wait = Reject
		} else {
			request.Route.Wait = Reject
		}
		started := time.Now()
		busy, err := newClient(t, options).Handle(ctx, connect(t), request,
			createOrder(who, 201, &calls))
		took := time.Since(started)
		_ = tx.Rollback(ctx)
		if err != nil || busy.Status != 409 || calls != 0 || took > time.Second {
			t.Fatalf("%s: %d after %v, %v", where, busy.Status, took, err)
		}
		if v, _ := busy.Headers.Get("Retry-After"); v != "1" {
			t.Errorf("%s: Retry-After %q", where, v)
		}
	}
}
