package idempotency

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// MiddlewareOptions configure Middleware.
type MiddlewareOptions struct {
	// Client runs the protocol (required).
	Client *Client
	// Connections gives a connection per request (FromPool(pool)); required unless
	// Router is set.
	Connections ConnSource
	// Router (Citus), instead of Connections: each request's connection comes from
	// the node that holds its principal's shard, so the whole request (the
	// handler's writes included) runs there. A call that answers the shard is not
	// on that node (IsStalePlacement) is reported (Router.ReportStalePlacement);
	// when it is the key's begin (the handler has not run), the request runs once
	// more on the principal's new route. See router.go.
	Router *Router
	// Principal returns the authenticated principal; false passes the request
	// to the handler untouched (it must refuse unauthenticated writes itself).
	// ("", true) is an authentication layer's mistake: answered 401 problem+json
	// (type about:blank), reported to OnError as ErrEmptyPrincipal.
	Principal func(r *http.Request) (string, bool)
	// Applies selects the requests the middleware handles (nil: all).
	Applies func(r *http.Request) bool
	// Route is this middleware's TTL, Wait and MethodsRequiringKey; each zero value
	// keeps the Client's. One Client and pool serve many routes: copy the options,
	// set Route, and call Middleware again.
	Route Route
	// MaxBodyBytes bounds the request body read for the fingerprint (0: 10 MiB);
	// a longer body is answered 413.
	MaxBodyBytes int64
	// OnError sees the errors the middleware answers itself (nil: none): the empty
	// principal (401), an unreadable or too long body (400, 413), errors the
	// protocol cannot map (500, or 503 for serialization failures left after the
	// retries) and database faults (IsDatabaseFault, or no connection), answered
	// with DatabaseFaultResponse: 503 database-unavailable, Retry-After. Every
	// answer of the middleware has a problem+json body.
	OnError func(r *http.Request, err error)
	// MaxStreamBytes is the longest streamed response kept for replay (0:
	// DefaultMaxStreamBytes). A handler streams by flushing (http.Flusher); a
	// longer stream is still sent whole, stored without its body, and a retry
	// gets 409 response-not-kept. See stream.go.
	MaxStreamBytes int64
}

// RequestContext is what the middleware hands the handler in the request's context.
type RequestContext struct {
	// Tx is the transaction that holds the key: do the request's writes here,
	// and do not commit.
	Tx pgx.Tx
	// Request is the request as fingerprinted.
	Request Request
	// OneTimeSecret: set it when the response carries a secret; it is sent once, not stored.
	OneTimeSecret bool
	// ResourceID: the id of what the request created, stored with the key.
	ResourceID string
}

type contextKey struct{}

// FromContext returns the middleware's RequestContext of a request, or nil
// when the middleware did not handle it.
func FromContext(ctx context.Context) *RequestContext {
	value, _ := ctx.Value(contextKey{}).(*RequestContext)
	return value
}

// ErrEmptyPrincipal is what OnError gets when Principal answered ("", true).
var ErrEmptyPrincipal = errors.New(
	"idempotency: Principal returned an empty principal with true" +
		" (return false for anonymous requests)")

// Middleware wraps an http.Handler in the transactional protocol: it reads the
// body once, runs the handler inside the transaction that holds the key
// (retrying serialization failures with a fresh response buffer and a fresh
// body), stores the final response, and answers replays (Idempotent-Replay:
// true), 400, 409 (Retry-After) and 422 itself. It panics when options lack
// Client, Principal, or exactly one of Connections and Router (a program's
// mistake, found at start).
func Middleware(options MiddlewareOptions) func(http.Handler) http.Handler {
	if options.Client == nil || options.Principal == nil ||
		(options.Connections == nil) == (options.Router == nil) {
		panic("idempotency: Middleware needs Client, Principal and either Connections or Router")
	}
	options.MaxBodyBytes = cmp.Or(options.MaxBodyBytes, 10<<20)
	options.MaxStreamBytes = cmp.Or(options.MaxStreamBytes, DefaultMaxStreamBytes)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			principal, ok := options.Principal(r)
			if !ok || (options.Applies != nil && !options.Applies(r)) {
				next.ServeHTTP(w, r)
				return
			}
			if principal == "" {
				fail(options, w, r, http.StatusUnauthorized, ErrEmptyPrincipal)
				return
			}
			serveKeyed(options, next, w, r, principal)
		})
	}
}

func serveKeyed(options MiddlewareOptions, next http.Handler, w http.ResponseWriter,
	r *http.Request,
	principal string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, options.MaxBodyBytes+1))
	if err != nil {
		fail(options, w, r, http.StatusBadRequest, err)
		return
	}
	if int64(len(body)) > options.MaxBodyBytes {
		fail(options, w, r, http.StatusRequestEntityTooLarge, errors.New("request body too large"))
		return
	}
	request := Request{Principal: principal, Key: r.Header.Get(KeyHeader), Method: r.Method,
		Path: r.URL.Path, Route: options.Route}
	if len(body) > 0 {
		request.Body = body
	}
	streamed := false // a stream started: the answer is on its way already
	run := &keyedRun{}
	handler := func(ctx context.Context, tx pgx.Tx) (Response, error) {
		run.ran = true
		if streamed { // a retry of a failed commit: the first attempt's stream went out
			return Response{}, errStreamBroken
		}
		attempt, keyed := tx.(*attemptTx)
		if !keyed {
			attempt = &attemptTx{} // a request without a key: pgx's own transaction
		}
		state := &RequestContext{Tx: tx, Request: request}
		inner := r.WithContext(context.WithValue(ctx, contextKey{}, state))
		inner.Body = io.NopCloser(bytes.NewReader(body)) // fresh for every attempt
		stream := &streamState{out: w, limit: options.MaxStreamBytes, expires: attempt.expires}
		capture := &captureWriter{header: http.Header{}, stream: stream}
		next.ServeHTTP(capture, inner)
		run.stale = run.stale || attempt.stale
		response := capture.response()
		response.OneTimeSecret = state.OneTimeSecret
		response.ResourceID = state.ResourceID
		if stream.started {
			streamed = true
			response = stream.streamed(response)
			if stream.gone != nil || attempt.retryable != nil {
				return Response{}, errStreamBroken // never rerun: part of it was sent
			}
		}
		return response, nil
	}
	response, connected, err := handleRouted(r.Context(), options, principal, request, handler, run)
	switch {
	case streamed && err != nil:
		options.report(r, err)
		// The client sees the stream broken (no last chunk), not a 500 inside it.
		panic(http.ErrAbortHandler)
	case streamed:
		return // sent; the body ends when this handler returns
	case !connected || IsDatabaseFault(err):
		// No connection, or the database failed under the request (before the begin, in
		// the handler, at the commit: rolled back or in doubt): a retry with the key is safe.
		options.report(r, err)
		client := options.Client.options
		WriteResponse(w, DatabaseFaultResponse(client.RetryAfter, client.ProblemTypeBase))
	case Retryable(err):
		fail(options, w, r, http.StatusServiceUnavailable, err)
	case err != nil:
		fail(options, w, r, http.StatusInternalServerError, err)
	default:
		WriteResponse(w, response)
	}
}

// keyedRun is what the middleware's handler saw of one request's runs.
type keyedRun struct {
	ran   bool // the handler ran: a stale placement is not run again
	stale bool // a statement of the handler met IsStalePlacement
}

// handleRouted runs the request through Handle on a connection of its own (from
// Connections, or the Router's route for principal); connected is false when none
// could be had. With a Router, a stale placement (IsStalePlacement: from the key's
// begin, the handler's statements or the completion) is reported, which drops the
// principal's placement. When the begin met it, the handler has not run and nothing
// was written (begin rolled back, the connection is given back): the request runs
// once more, on the principal's route looked up again. Otherwise, or when that
// fails too, the error is the request's, as any other.
func handleRouted(ctx context.Context, options MiddlewareOptions, principal string,
	request Request, handler Handler, run *keyedRun) (Response, bool, error) {
	if options.Router == nil {
		return handleOn(ctx, options.Client, options.Connections, request, handler)
	}
	connections := options.Router.Connections(principal)
	for try := 1; ; try++ {
		response, connected, err := handleOn(ctx, options.Client, connections, request, handler)
		if !IsStalePlacement(err) && !run.stale {
			return response, connected, err
		}
		options.Router.ReportStalePlacement(principal)
		if run.ran || try == 2 {
			return response, connected, err
		}
	}
}

// handleOn runs Handle on a connection from connections, given back when it returns
// (a panicking handler included); false when no connection could be had.
func handleOn(ctx context.Context, client *Client, connections ConnSource, request Request,
	handler Handler) (Response, bool, error) {
	conn, release, err := connections(ctx)
	if err != nil {
		return Response{}, false, err
	}
	defer release()
	response, err := client.Handle(ctx, conn, request, handler)
	return response, true, err
}

// report hands err to OnError, when there is one.
func (options MiddlewareOptions) report(r *http.Request, err error) {
	if options.OnError != nil {
		options.OnError(r, err)
	}
}

// fail answers an error the middleware cannot map to the protocol: an RFC 9457
// problem of type about:blank (its title the status's reason phrase, its detail
// failDetails', generated from client/protocol.json).
func fail(options MiddlewareOptions, w http.ResponseWriter, r *http.Request, status int,
	err error) {
	options.report(r, err)
	blank := Problem{Status: status, Title: http.StatusText(status)} // type base + "": about:blank
	response := ProblemResponse(blank, failDetails[status], "about:blank")
	if status == http.StatusServiceUnavailable {
		response.Headers.Set("Retry-After", strconv.Itoa(DefaultRetryAfterSeconds))
	}
	WriteResponse(w, response)
}

// WriteResponse sends a Response on a ResponseWriter; a stream (Chunks set) is
// written one chunk at a time, flushed after each.
func WriteResponse(w http.ResponseWriter, response Response) {
	for _, field := range response.Headers {
		w.Header().Add(field.Name, field.Value)
	}
	w.WriteHeader(response.Status)
	if response.Chunks != nil {
		writeStreamed(w, response)
		return
	}
	_, _ = w.Write(response.Body)
}
