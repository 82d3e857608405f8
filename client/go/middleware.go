package idempotency

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ConnSource hands the middleware an idle connection for one request and a
// function that gives it back.
type ConnSource func(ctx context.Context) (conn *pgx.Conn, release func(), err error)

// FromPool is a ConnSource on a pgxpool.Pool.
func FromPool(pool *pgxpool.Pool) ConnSource {
	return func(ctx context.Context) (*pgx.Conn, func(), error) {
		held, err := pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return held.Conn(), held.Release, nil
	}
}

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
	Principal func(r *http.Request) (string, bool)
	// Applies selects the requests the middleware handles (default: all).
	Applies func(r *http.Request) bool
	// MaxBodyBytes bounds the request body read for the fingerprint (10 MiB);
	// a longer body is answered 413.
	MaxBodyBytes int64
	// Duplicates chooses, per request, what a duplicate of a running request
	// does: DuplicatesWait or DuplicatesReject ("" or nil: the Client's option).
	Duplicates func(r *http.Request) DuplicateMode
	// OnError sees errors the middleware answers with 500 or 503 (default: none). A
	// database fault (IsDatabaseFault, or no connection) is answered with
	// DatabaseFaultResponse: 503 database-unavailable, Retry-After.
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

// Middleware wraps an http.Handler in the transactional protocol: it reads the
// body once, runs the handler inside the transaction that holds the key
// (retrying serialization failures with a fresh response buffer and a fresh
// body), stores the final response, and answers replays (Idempotent-Replay:
// true), 400, 409 (Retry-After) and 422 itself.
func Middleware(options MiddlewareOptions) func(http.Handler) http.Handler {
	if options.Client == nil || options.Principal == nil ||
		(options.Connections == nil) == (options.Router == nil) {
		panic("idempotency: Middleware needs Client, Principal and either Connections or Router")
	}
	if options.MaxBodyBytes == 0 {
		options.MaxBodyBytes = 10 << 20
	}
	if options.MaxStreamBytes == 0 {
		options.MaxStreamBytes = DefaultMaxStreamBytes
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			principal, ok := options.Principal(r)
			if !ok || (options.Applies != nil && !options.Applies(r)) {
				next.ServeHTTP(w, r)
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
		Path: r.URL.Path}
	if options.Duplicates != nil {
		request.Duplicates = options.Duplicates(r)
	}
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
		state := &RequestContext{Tx: tx, Request: request}
		inner := r.WithContext(context.WithValue(ctx, contextKey{}, state))
		inner.Body = io.NopCloser(bytes.NewReader(body)) // fresh for every attempt
		stream := &streamState{out: w, limit: options.MaxStreamBytes}
		if attempt, ok := tx.(*attemptTx); ok {
			stream.expires = attempt.expires
		}
		capture := &captureWriter{header: http.Header{}, stream: stream}
		next.ServeHTTP(capture, inner)
		if attempt, ok := tx.(*attemptTx); ok && attempt.stale {
			run.stale = true
		}
		response := capture.response()
		response.OneTimeSecret = state.OneTimeSecret
		response.ResourceID = state.ResourceID
		if stream.started {
			streamed = true
			response = stream.streamed(response)
			if attempt, ok := tx.(*attemptTx); stream.gone != nil || (ok && attempt.retryable != nil) {
				return Response{}, errStreamBroken // never rerun: part of it was sent
			}
		}
		return response, nil
	}
	response, connected, err := handleRouted(r.Context(), options, principal, request, handler, run)
	if !streamed && (!connected || IsDatabaseFault(err)) {
		// No connection, or the database failed under the request (before the begin, in
		// the handler, at the commit: rolled back or in doubt): a retry with the key is safe.
		if options.OnError != nil {
			options.OnError(r, err)
		}
		WriteResponse(w, faultResponse(options.Client))
		return
	}
	if streamed {
		if err != nil {
			if options.OnError != nil {
				options.OnError(r, err)
			}
			// The client sees the stream broken (no last chunk), not a 500 inside it.
			panic(http.ErrAbortHandler)
		}
		return // sent; the body ends when this handler returns
	}
	if err != nil {
		status := http.StatusInternalServerError
		if Retryable(err) {
			status = http.StatusServiceUnavailable
		}
		fail(options, w, r, status, err)
		return
	}
	WriteResponse(w, response)
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
	response, connected, err := handleOn(ctx, options.Client, connections, request, handler)
	if !IsStalePlacement(err) && !run.stale {
		return response, connected, err
	}
	options.Router.ReportStalePlacement(principal)
	if run.ran {
		return response, connected, err
	}
	response, connected, err = handleOn(ctx, options.Client, connections, request, handler)
	if IsStalePlacement(err) || run.stale {
		options.Router.ReportStalePlacement(principal)
	}
	return response, connected, err
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

// fail answers an error the middleware cannot map to the protocol.
func fail(options MiddlewareOptions, w http.ResponseWriter, r *http.Request, status int,
	err error) {
	if options.OnError != nil {
		options.OnError(r, err)
	}
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", strconv.Itoa(DefaultRetryAfterSeconds))
	}
	http.Error(w, http.StatusText(status), status)
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

// captureWriter collects a handler's response instead of sending it, until the
// handler flushes: then it streams (stream.go).
type captureWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	stream *streamState
}

func (c *captureWriter) Header() http.Header { return c.header }

func (c *captureWriter) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.stream != nil && c.stream.started {
		if c.stream.gone != nil {
			return 0, c.stream.gone // the client has gone: the handler may stop
		}
		return c.stream.pending.Write(p)
	}
	return c.body.Write(p)
}

// response is the captured response; header names sorted, so what is stored
// does not depend on Go's map order.
func (c *captureWriter) response() Response {
	status := c.status
	if status == 0 {
		status = http.StatusOK
	}
	names := make([]string, 0, len(c.header))
	for name := range c.header {
		names = append(names, name)
	}
	sort.Strings(names)
	headers := Headers{}
	for _, name := range names {
		for _, value := range c.header[name] {
			headers = append(headers, HeaderField{name, value})
		}
	}
	return Response{Status: status, Headers: headers, Body: c.body.Bytes()}
}
