package idempotency

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"testing"
	"time"
)

// The outcome "expired" (a retry of a key that expired under the action's
// on_expiry 'refuse' policy: 410 with the past Idempotency-Expires), and the lease
// runner's expiry and wait/reject mode. The end-to-end expired test needs an
// extension with idempotency.set_expiry_policy (0.8.0) and is skipped, saying so,
// on an older one.

const pastEpoch = int64(1700000000) // Tue, 14 Nov 2023 22:13:20 GMT

func checkGone(t *testing.T, what string, response Response) {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal(response.Body, &body); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	expired := protocolOutcome(t, "expired")
	want := map[string]any{"status": float64(410), "title": "Idempotency-Key has expired",
		"type": "/problems/idempotency-key-expired", "detail": expired.Detail}
	if response.Status != 410 || len(body) != len(want) {
		t.Fatalf("%s: %d %s", what, response.Status, response.Body)
	}
	for name, value := range want {
		if body[name] != value {
			t.Errorf("%s: %s is %v, not %v", what, name, body[name], value)
		}
	}
	if _, replayed := response.Headers.Get(ReplayHeader); replayed || response.Replayed {
		t.Errorf("%s: marked replayed", what)
	}
}

func TestTheWaitArgumentFollowsTheRouteThenTheOptions(t *testing.T) {
	wait := func(route, options Wait) any {
		merged, _ := Options{Wait: options}.route(Route{Wait: route}) // no TTL: no error
		return merged.Wait.arg()
	}
	if got := wait(Wait{}, Reject); got != time.Duration(0) {
		t.Errorf("reject in the options: %v", got)
	}
	if got := wait(Reject, WaitUpTo(3*time.Second)); got != time.Duration(0) {
		t.Errorf("reject on the route: %v", got)
	}
	if got := wait(WaitUpTo(3*time.Second), Reject); got != 3*time.Second {
		t.Errorf("wait on the route: %v", got)
	}
	if got := wait(WaitServer, Reject); got != nil {
		t.Errorf("the server's wait on the route: %v", got)
	}
	if got := wait(Wait{}, Wait{}); got != nil {
		t.Errorf("nothing set: %v", got)
	}
	if WaitUpTo(0) != Reject || WaitUpTo(-time.Second) != Reject || (Wait{}).IsSet() {
		t.Error("WaitUpTo(0) is Reject; the zero Wait is unset")
	}
}

func TestALeaseResultCarriesTheRowsExpiry(t *testing.T) {
	runner, who, calls := newRunner(t, LeaseOptions{Policy: Remember}), principal(t), 0
	first := run(t, runner, paymentRequest(who, "k", payment), effect(&calls, 201))
	want := scalarInt(t, "SELECT floor(extract(epoch FROM expires_at))::bigint"+
		" FROM idempotency.lookup($1, 'k')", who)
	if first.Outcome != Fresh || first.ExpiresEpoch == nil || *first.ExpiresEpoch != want ||
		want <= time.Now().Unix() {
		t.Fatalf("fresh: %v %v (want %d)", first.Outcome, first.ExpiresEpoch, want)
	}
	if v, _ := first.Response.Headers.Get(ExpiresHeader); v != HTTPDate(want) {
		t.Errorf("fresh header %q", v)
	}
	again := run(t, runner, paymentRequest(who, "k", payment), effect(&calls, 201))
	if v, _ := again.Response.Headers.Get(ExpiresHeader); again.Outcome != Replayed ||
		v != HTTPDate(want) || *again.ExpiresEpoch != want {
		t.Errorf("replay: %v %q", again.Outcome, v)
	}
	released := run(t, runner, paymentRequest(who, "k2", payment), effect(&calls, 503))
	if _, has := released.Response.Headers.Get(ExpiresHeader); has ||
		released.ExpiresEpoch != nil {
		t.Errorf("released: %v", released.ExpiresEpoch)
	}
}

func TestTheLeaseRunnerRejectsADuplicateAtOnce(t *testing.T) {
	ctx, who, calls := context.Background(), principal(t), 0
	holder := connect(t)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var outcome string
	err = tx.QueryRow(ctx, "SELECT outcome FROM idempotency.begin($1, 'rej', 'POST /payments',"+
		" idempotency.fingerprint('POST', '/payments', $2::bytea))", who,
		[]byte(payment)).Scan(&outcome)
	if err != nil || outcome != "started" {
		t.Fatalf("holder: %s %v", outcome, err)
	}
	runner := newRunner(t, LeaseOptions{Wait: Reject})
	started := time.Now()
	busy := run(t, runner, paymentRequest(who, "rej", payment), effect(&calls, 201))
	if took := time.Since(started); busy.Outcome != InProgress || calls != 0 || took > time.Second {
		t.Fatalf("%v after %v", busy.Outcome, took)
	}
}

func TestAnExpiredKeyIs410WithoutRunning(t *testing.T) {
	if scalarInt(t, "SELECT (to_regproc('idempotency.set_expiry_policy') IS NOT NULL)::int") == 0 {
		t.Skip("the extension has no idempotency.set_expiry_policy (0.8.0 tombstones)")
	}
	ordersTable(t)
	exec1(t, "SELECT idempotency.set_expiry_policy('POST /orders', 'refuse')")
	defer exec1(t, "SELECT idempotency.set_expiry_policy('POST /orders', 'run')")
	ctx, who, calls := context.Background(), principal(t), 0
	client, conn := newClient(t, Options{}), connect(t)
	first, err := client.Handle(ctx, conn, orderRequest(who, "gone", order),
		createOrder(who, 201, &calls))
	if err != nil || first.Status != 201 {
		t.Fatalf("first: %d %v", first.Status, err)
	}
	// The contract's test sequence: the key expires now and cleanup leaves a tombstone.
	exec1(t, "UPDATE idempotency.keys SET created_at = now() - interval '1 hour',"+
		" expires_at = now() - interval '1 second'"+
		" WHERE principal = $1 AND key = 'gone'", who)
	expired := time.Now().Unix() - 1
	exec1(t, "SELECT idempotency.cleanup_batch(1000)")
	gone, err := client.Handle(ctx, conn, orderRequest(who, "gone", order),
		createOrder(who, 201, &calls))
	if err != nil {
		t.Fatal(err)
	}
	checkGone(t, "client", gone)
	value, _ := gone.Headers.Get(ExpiresHeader)
	told, err := http.ParseTime(value)
	if err != nil || math.Abs(float64(told.Unix()-expired)) > 1 || !told.Before(time.Now()) {
		t.Errorf("%s %q %v", ExpiresHeader, value, err)
	}
	if calls != 1 || client.Counters().Expired != 1 {
		t.Errorf("calls %d, counted %d", calls, client.Counters().Expired)
	}
	other, err := client.Handle(ctx, conn, orderRequest(who, "gone", "{}"),
		createOrder(who, 201, &calls))
	if err != nil || other.Status != 422 || calls != 1 {
		t.Errorf("another body: %d %v", other.Status, err)
	}
	runner := newRunner(t, LeaseOptions{})
	leased := run(t, runner, orderRequest(who, "gone", order), func(context.Context) (Response,
		error) {
		calls++
		return Response{Status: 201}, nil
	})
	if leased.Outcome != Expired || leased.ExpiresEpoch == nil || calls != 1 {
		t.Fatalf("lease: %v", leased.Outcome)
	}
	checkGone(t, "lease", leased.Response)
}
