package idempotency

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// service is a net/http handler behind the middleware, on a test server.
func service(t *testing.T, client *Client, handler http.HandlerFunc) *httptest.Server {
	t.Helper()
	principalOf := func(r *http.Request) (string, bool) {
		token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		return token, token != "" && token != r.Header.Get("Authorization")
	}
	wrap := Middleware(MiddlewareOptions{Client: client, Connections: FromPool(newPool(t)),
		Principal: principalOf,
		Applies:   func(r *http.Request) bool { return r.Method == http.MethodPost }})
	server := httptest.NewServer(wrap(handler))
	t.Cleanup(server.Close)
	return server
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, server *httptest.Server, path, who, key, body string) reply {
	t.Helper()
	request, _ := http.NewRequest(http.MethodPost, server.URL+path, strings.NewReader(body))
	if who != "" {
		request.Header.Set("Authorization", "Bearer "+who)
	}
	if key != "" {
		request.Header.Set(KeyHeader, key)
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	data, _ := io.ReadAll(response.Body)
	return reply{response.StatusCode, response.Header, data}
}

// orderHandler inserts an order in the middleware's transaction; ?status=N
// answers N instead of 201, ?secret=1 marks a one-time secret.
func orderHandler(t *testing.T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		state := FromContext(r.Context())
		if state == nil { // not handled by the middleware (no principal)
			w.WriteHeader(201)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var id int64
		err := state.Tx.QueryRow(r.Context(),
			"INSERT INTO go_orders (principal, item) VALUES ($1, $2)"+
				" RETURNING id", state.Request.Principal, string(body)).Scan(&id)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		status := 201
		if s := r.URL.Query().Get("status"); s != "" {
			status, _ = strconv.Atoi(s)
		}
		state.ResourceID = strconv.FormatInt(id, 10)
		state.OneTimeSecret = r.URL.Query().Get("secret") == "1"
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+state.ResourceID)
		w.Header().Set("X-Request-Time", time.Now().String())
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"id":` + state.ResourceID + `}`))
	}
}

func TestMiddlewareReplaysMismatchesAndKeepsHeaders(t *testing.T) {
	ordersTable(t)
	server, who := service(t, newClient(t, Options{}), orderHandler(t)), principal(t)
	first := post(t, server, "/orders", who, "k", order)
	if first.status != 201 || first.header.Get(ReplayHeader) != "" {
		t.Fatalf("first %+v", first)
	}
	again := post(t, server, "/orders", who, "k", orderRespelled)
	if again.status != 201 || again.header.Get(ReplayHeader) != "true" || !bytes.Equal(again.body,
		first.body) ||
		again.header.Get("Location") != first.header.Get("Location") ||
		again.header.Get("Content-Type") != "application/json" ||
		again.header.Get("X-Request-Time") != "" {
		t.Fatalf("replay %+v", again)
	}
	other := post(t, server, "/orders", who, "k", `{"item":"pen"}`)
	if other.status != 422 || string(other.body) != cppKeyReuse ||
		other.header.Get("Content-Type") != ProblemContentType {
		t.Fatalf("mismatch %+v", other)
	}
	missing := post(t, server, "/orders", who, "", order)
	if missing.status != 400 || !bytes.Contains(missing.body, []byte("idempotency-key-missing")) {
		t.Fatalf("missing key %+v", missing)
	}
	anonymous := post(t, server, "/orders", "", "", "anonymous")
	if anonymous.status != 201 || orders(t, who) != 1 {
		t.Fatalf("a request without a principal is passed through: %+v, %d orders", anonymous,
			orders(t, who))
	}
}

func TestMiddlewareDoesNotStoreA500AndStoresA404(t *testing.T) {
	ordersTable(t)
	server, who := service(t, newClient(t, Options{}), orderHandler(t)), principal(t)
	if r := post(t, server, "/orders?status=500", who, "k", order); r.status != 500 || orders(t,
		who) != 0 {
		t.Fatalf("500: %+v, %d orders", r, orders(t, who))
	}
	if r := post(t, server, "/orders", who, "k",
		order); r.status != 201 || r.header.Get(ReplayHeader) != "" {
		t.Fatalf("retry after 500: %+v", r)
	}
	if r := post(t, server, "/orders?status=404", who, "k2", order); r.status != 404 || orders(t,
		who) != 1 {
		t.Fatalf("404: %+v", r)
	}
	if r := post(t, server, "/orders", who, "k2",
		order); r.status != 404 || r.header.Get(ReplayHeader) != "true" {
		t.Fatalf("stored 404: %+v", r)
	}
}

func TestMiddlewareOneTimeSecretAndInProgress(t *testing.T) {
	ordersTable(t)
	client := newClient(t, Options{Wait: WaitUpTo(100 * time.Millisecond)})
	server, who := service(t, client, orderHandler(t)), principal(t)
	if r := post(t, server, "/orders?secret=1", who, "s", order); r.status != 201 {
		t.Fatalf("%+v", r)
	}
	secret := post(t, server, "/orders?secret=1", who, "s", order)
	if secret.status != 409 || secret.header.Get(ReplayHeader) != "true" ||
		!bytes.Contains(secret.body, []byte("/problems/one-time-secret")) {
		t.Fatalf("secret retry %+v", secret)
	}
	ctx := context.Background()
	holder := connect(t)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT * FROM idempotency.begin($1, 'held', 'test',"+
		" idempotency.fingerprint('POST', '/orders', $2::bytea))", who, []byte(order))
	if err != nil {
		t.Fatal(err)
	}
	busy := post(t, server, "/orders", who, "held", order)
	if busy.status != 409 || busy.header.Get("Retry-After") != "1" ||
		!bytes.Contains(busy.body, []byte("/problems/request-in-progress")) {
		t.Fatalf("held %+v", busy)
	}
}

func TestMiddlewareRetriesASerializationFailureWithAFreshBuffer(t *testing.T) {
	ordersTable(t)
	runs := 0
	handler := func(w http.ResponseWriter, r *http.Request) {
		runs++
		state := FromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Run", strconv.Itoa(runs))
		_, _ = w.Write([]byte("partial "))
		if runs == 1 {
			_, err := state.Tx.Exec(r.Context(),
				"DO $$ BEGIN RAISE EXCEPTION 'c' USING ERRCODE = '40001'; END $$")
			http.Error(w, err.Error(), 500)
			return
		}
		_, _ = w.Write(body)
	}
	server, who := service(t, newClient(t, Options{}), handler), principal(t)
	got := post(t, server, "/orders", who, "k", order)
	if got.status != 200 || string(got.body) != "partial "+order ||
		got.header.Get("X-Run") != "2" ||
		runs != 2 {
		t.Fatalf("%+v runs %d", got, runs)
	}
}

// A backend terminated or a statement cancelled under the handler is answered with
// the one fault answer (503, Retry-After), the handler's own 500 replaced; nothing
// is kept and the pool serves the next request.
func TestMiddlewareAnswersADatabaseFault(t *testing.T) {
	pool := newPool(t)
	client, err := NewClient(Options{})
	if err != nil {
		t.Fatal(err)
	}
	handler := Middleware(MiddlewareOptions{Client: client, Connections: FromPool(pool),
		Principal: func(r *http.Request) (string, bool) { return "fault", true }})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			state := FromContext(r.Context())
			signal := "pg_terminate_backend"
			if r.URL.Path == "/cancel" {
				signal = "pg_cancel_backend"
			}
			if _, err := state.Tx.Exec(r.Context(),
				"SELECT "+signal+"(pg_backend_pid()), pg_sleep(5)"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
	want := DatabaseFaultResponse(DefaultRetryAfterSeconds, "")
	for _, path := range []string{"/die", "/cancel", "/die"} {
		request := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
		request.Header.Set(KeyHeader, path+"-"+t.Name())
		recorder := httptest.NewRecorder()
		handler.ServeHTTP(recorder, request)
		if recorder.Code != 503 || recorder.Body.String() != string(want.Body) ||
			recorder.Header().Get("Retry-After") != "1" {
			t.Fatalf("%s: %d %q %q", path, recorder.Code, recorder.Body.String(),
				recorder.Header().Get("Retry-After"))
		}
	}
	if !IsDatabaseFault(&pgconn.PgError{Code: "57P01"}) ||
		IsDatabaseFault(&pgconn.PgError{Code: "23505"}) ||
		IsDatabaseFault(errors.New("the handler failed")) {
		t.Fatal("IsDatabaseFault classifies wrongly")
	}
}
