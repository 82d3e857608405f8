package idempotency

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const payment = `{"amount":100}`

func paymentRequest(who, key, body string) Request {
	return Request{Principal: who, Key: key, Method: "POST", Path: "/payments", Body: []byte(body)}
}

func newRunner(t *testing.T, options LeaseOptions) *LeaseRunner {
	t.Helper()
	runner, err := NewLeaseRunner(newPool(t), options)
	if err != nil {
		t.Fatal(err)
	}
	return runner
}

// effect answers status and counts its calls.
func effect(calls *int, status int) Effect {
	var mu sync.Mutex
	return func(ctx context.Context) (Response, error) {
		mu.Lock()
		*calls++
		mu.Unlock()
		return Response{Status: status, Headers: Headers{{"Content-Type", "application/json"},
			{"Location", "/p/1"}}, Body: []byte(`{"paid":true}`)}, nil
	}
}

func run(t *testing.T, r *LeaseRunner, req Request, e Effect) LeaseResult {
	t.Helper()
	result, err := r.Run(context.Background(), req, e)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return result
}

func TestRememberReplaysTheStoredResponse(t *testing.T) {
	runner, who, calls := newRunner(t, LeaseOptions{Policy: Remember}), principal(t), 0
	first := run(t, runner, paymentRequest(who, "k", payment), effect(&calls, 201))
	if first.Outcome != Fresh || first.Fence <= 0 {
		t.Fatalf("%+v", first)
	}
	again := run(t, runner, paymentRequest(who, "k", `{ "amount": 1e2 }`), effect(&calls, 201))
	if location, _ := again.Response.Headers.Get("Location"); again.Outcome != Replayed ||
		string(again.Response.Body) != `{"paid":true}` || location != "/p/1" || calls != 1 {
		t.Fatalf("%+v", again)
	}
	other := run(t, runner, paymentRequest(who, "k", `{"amount":5}`), effect(&calls, 201))
	if other.Outcome != Mismatch || other.Response.Status != 422 {
		t.Fatalf("%+v", other)
	}
}

func TestRememberReleasesANonFinalResponse(t *testing.T) {
	runner, who, calls := newRunner(t, LeaseOptions{Policy: Remember}), principal(t), 0
	if r := run(t, runner, paymentRequest(who, "k", payment), effect(&calls,
		503)); r.Outcome != Fresh {
		t.Fatalf("%+v", r)
	}
	if r := run(t, runner, paymentRequest(who, "k", payment), effect(&calls,
		201)); r.Outcome != Fresh ||
		calls != 2 {
		t.Fatalf("%+v calls %d", r, calls)
	}
}

func TestOnceHoldsTheKeyEvenAfterAFailure(t *testing.T) {
	runner, who := newRunner(t, LeaseOptions{Policy: Once}), principal(t)
	boom := errors.New("upstream down")
	_, err := runner.Run(context.Background(), paymentRequest(who, "k", payment),
		func(ctx context.Context) (Response, error) { return Response{}, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("error %v", err)
	}
	calls := 0
	duplicate := run(t, runner, paymentRequest(who, "k", payment), effect(&calls, 201))
	if duplicate.Outcome != Duplicate || duplicate.Response.Status != 409 || calls != 0 ||
		!strings.Contains(string(duplicate.Response.Body),
			`"type":"/problems/request-already-processed"`) {
		t.Fatalf("%+v", duplicate)
	}
}

func TestCommitOnSuccessReleasesAFailure(t *testing.T) {
	runner, who, calls := newRunner(t, LeaseOptions{Policy: CommitOnSuccess}), principal(t), 0
	outcomes := []LeaseOutcome{}
	for _, status := range []int{502, 200, 200} {
		outcomes = append(outcomes, run(t, runner, paymentRequest(who, "k", payment), effect(&calls,
			status)).Outcome)
	}
	if outcomes[0] != Fresh || outcomes[1] != Fresh || outcomes[2] != Duplicate || calls != 2 {
		t.Fatalf("%v calls %d", outcomes, calls)
	}
	boom := errors.New("boom")
	_, err := runner.Run(context.Background(), paymentRequest(who, "k2", payment),
		func(ctx context.Context) (Response, error) { return Response{}, boom })
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if r := run(t, runner, paymentRequest(who, "k2", payment), effect(&calls,
		200)); r.Outcome != Fresh {
		t.Fatalf("after an error the key was not released: %+v", r)
	}
}

func TestALiveLeaseIsInProgress(t *testing.T) {
	holder := newRunner(t, LeaseOptions{Lease: 5 * time.Second})
	other, who := newRunner(t, LeaseOptions{}), principal(t)
	var busy LeaseResult
	result := run(t, holder, paymentRequest(who, "k", payment), func(ctx context.Context) (Response,
		error) {
		busy = run(t, other, paymentRequest(who, "k", payment), effect(new(int), 201))
		return Response{Status: 201, Body: []byte("{}")}, nil
	})
	retry, _ := busy.Response.Headers.Get("Retry-After")
	seconds, _ := strconv.Atoi(retry)
	if result.Outcome != Fresh || busy.Outcome != InProgress || busy.Response.Status != 409 ||
		seconds < 1 || seconds > 5 {
		t.Fatalf("%+v / %+v", result, busy)
	}
}

func TestRenewalKeepsABodyLongerThanTheLease(t *testing.T) {
	runner, who := newRunner(t, LeaseOptions{Lease: 300 * time.Millisecond}), principal(t)
	thief, stolen := newRunner(t, LeaseOptions{}), LeaseResult{}
	result := run(t, runner, paymentRequest(who, "k", payment), func(ctx context.Context) (Response,
		error) {
		time.Sleep(700 * time.Millisecond) // more than twice the lease
		stolen = run(t, thief, paymentRequest(who, "k", payment), effect(new(int), 201))
		time.Sleep(300 * time.Millisecond)
		return Response{Status: 201, Body: []byte("{}")}, nil
	})
	if result.Outcome != Fresh || result.Renewals < 2 || stolen.Outcome != InProgress {
		t.Fatalf("%+v, the other caller got %s", result, stolen.Outcome)
	}
}

func TestALostLeaseIsFreshUnfenced(t *testing.T) {
	runner := newRunner(t, LeaseOptions{Lease: 200 * time.Millisecond, NoRenew: true})
	thief, who, calls := newRunner(t, LeaseOptions{Lease: 5 * time.Second}), principal(t), 0
	var taken LeaseResult
	result := run(t, runner, paymentRequest(who, "k", payment), func(ctx context.Context) (Response,
		error) {
		time.Sleep(500 * time.Millisecond) // the lease runs out; another holder takes the key over
		taken = run(t, thief, paymentRequest(who, "k", payment), effect(&calls, 201))
		return Response{Status: 201, Body: []byte("{}")}, nil
	})
	if result.Outcome != FreshUnfenced || taken.Outcome != Fresh || taken.Fence <= result.Fence ||
		calls != 1 {
		t.Fatalf("%+v / %+v", result, taken)
	}
	replay := run(t, thief, paymentRequest(who, "k", payment), effect(&calls, 201))
	if replay.Outcome != Replayed || string(replay.Response.Body) != `{"paid":true}` {
		t.Fatalf("the thief's response was not the one kept: %+v", replay)
	}
}

func TestLeaseRejectsMissingAndMalformedKeys(t *testing.T) {
	runner, who := newRunner(t, LeaseOptions{}), principal(t)
	missing := run(t, runner, paymentRequest(who, "", payment), effect(new(int), 201))
	bad := run(t, runner, paymentRequest(who, "bad\u00e9", payment), effect(new(int), 201))
	if missing.Outcome != Rejected || missing.Response.Status != 400 || bad.Outcome != Rejected ||
		!strings.Contains(string(bad.Response.Body), "idempotency-key-malformed") {
		t.Fatalf("%+v / %+v", missing, bad)
	}
}

func TestConcurrentRunsOnOneRunner(t *testing.T) {
	runner, who := newRunner(t, LeaseOptions{Lease: 300 * time.Millisecond}), principal(t)
	var wg sync.WaitGroup
	outcomes := make([]LeaseOutcome, 4)
	for i := range outcomes {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			result, err := runner.Run(context.Background(), paymentRequest(who, "k"+strconv.Itoa(i),
				payment),
				func(ctx context.Context) (Response, error) {
					time.Sleep(200 * time.Millisecond)
					return Response{Status: 201}, nil
				})
			if err == nil {
				outcomes[i] = result.Outcome
			}
		}(i)
	}
	wg.Wait()
	for i, o := range outcomes {
		if o != Fresh {
			t.Errorf("run %d: %s", i, o)
		}
	}
}
