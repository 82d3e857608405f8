package idempotency

import (
	"errors"
	"slices"
	"strings"
	"time"
)

// Settings per route. Each setting is looked up from the most specific level to
// the least: the Route of the call (Request.Route, MiddlewareOptions.Route), then
// the Client's Options (or LeaseOptions), then the server's settings
// (idempotency.key_ttl, idempotency.wait_timeout). A zero value at one level
// always means "the next level's"; it never means "none" or "do not wait".

// Wait says what a keyed request does when its key is held by a running
// transaction (a duplicate of a request in flight). Make one with WaitUpTo,
// WaitServer or Reject; the zero value, Wait{}, is "not set here" (the next
// level's; at the last level the server's idempotency.wait_timeout).
type Wait struct {
	mode  waitMode
	limit time.Duration
}

type waitMode uint8

const (
	waitUnset waitMode = iota
	waitServer
	waitLimit
	waitReject
)

// WaitUpTo waits up to limit for the holder, then replays its stored response or
// answers 409 request-in-progress with Retry-After. A limit of zero or less does
// not wait at all: it is Reject.
func WaitUpTo(limit time.Duration) Wait {
	if limit <= 0 {
		return Reject
	}
	return Wait{mode: waitLimit, limit: limit}
}

// WaitServer waits as long as the server's idempotency.wait_timeout says; it
// overrides a Client's WaitUpTo or Reject on one route.
var WaitServer = Wait{mode: waitServer}

// Reject answers a duplicate of a running request 409 request-in-progress with
// Retry-After at once (protocol.json's duplicate mode reject: begin with wait 0). A
// live lease is answered so in every mode.
var Reject = Wait{mode: waitReject}

// IsSet reports whether w was chosen (it is not the zero Wait).
func (w Wait) IsSet() bool { return w.mode != waitUnset }

// String names w: "unset", "server", "reject" or "up to 3s".
func (w Wait) String() string {
	switch w.mode {
	case waitServer:
		return "server"
	case waitLimit:
		return "up to " + w.limit.String()
	case waitReject:
		return "reject"
	}
	return "unset"
}

// arg is w as the wait argument of begin and acquire: 0 to reject, nil for the
// server's wait_timeout.
func (w Wait) arg() any {
	switch w.mode {
	case waitReject:
		return time.Duration(0)
	case waitLimit:
		return w.limit
	}
	return nil
}

// Route is the protocol's settings of one route (or one call). Every zero value
// keeps the Client's setting (Options, LeaseOptions), whose own zero values keep
// the server's.
type Route struct {
	// TTL is how long the route's keys count. 0: the Client's TTL (0 there: the
	// server's idempotency.key_ttl). Negative is an error.
	TTL time.Duration
	// Wait is what a duplicate of a running request does (WaitUpTo, WaitServer,
	// Reject). Wait{}: the Client's Wait (unset there: idempotency.wait_timeout).
	Wait Wait
	// MethodsRequiringKey are the methods answered 400 idempotency-key-missing
	// without an Idempotency-Key; a request of another method without a key runs in
	// a plain transaction, nothing stored. nil: the Client's (POST, PATCH); an
	// empty, non-nil list: no method requires a key.
	MethodsRequiringKey []string
}

// errNegativeTTL refuses a TTL below zero (there is no "already expired" key).
var errNegativeTTL = errors.New("idempotency: TTL must not be negative (0 keeps the default)")

// requiresKey reports whether a request of this method needs a key on the route.
func (r Route) requiresKey(method string) bool {
	return slices.ContainsFunc(r.MethodsRequiringKey, func(m string) bool {
		return strings.EqualFold(m, method)
	})
}
