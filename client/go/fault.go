package idempotency

// Database faults: the errors that mean the database failed under a request (its
// connection died, the server shut down, crashed or refused connections, the
// statement was cancelled, the commit's outcome is unknown), not the request's
// own. The middleware answers them with DatabaseFaultResponse (protocol.json
// database_fault: 503, Retry-After, retry with the same key). And the stale
// placement (Citus), which the middleware reroutes: the errors a handler's
// transaction notes (tx.go) are classified here, below the runner and the router.

import (
	"cmp"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsDatabaseFault reports whether err says the database failed or could not be
// reached: a server error whose SQLSTATE is in DatabaseFault's classes or list,
// a failed connect, a network error or a closed connection. The application's
// own errors and the server's other errors (constraint violations) are not.
func IsDatabaseFault(err error) bool {
	if err == nil {
		return false
	}
	var server *pgconn.PgError
	if errors.As(err, &server) {
		return slices.Contains(DatabaseFaultSQLStates, server.Code) ||
			slices.ContainsFunc(DatabaseFaultSQLStateClasses, func(class string) bool {
				return strings.HasPrefix(server.Code, class)
			})
	}
	var network net.Error
	if errors.As(err, &network) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	// pgconn's own words for a connection it closed or lost (no error type of their own).
	return slices.ContainsFunc([]string{"conn closed", "closed pool", "failed to connect",
		"connection reset", "broken pipe", "unexpected EOF", "timeout: context"},
		func(lost string) bool { return strings.Contains(err.Error(), lost) })
}

// DatabaseFaultResponse is the one answer to a database fault: 503
// database-unavailable with Retry-After (at least 1 second); typeBase prefixes the
// problem type ("" for DefaultProblemTypeBase). A retry with the same key runs
// the request once or replays its stored response.
func DatabaseFaultResponse(retryAfter int, typeBase string) Response {
	response := ProblemResponse(ProblemDatabaseUnavailable, DatabaseFaultDetail,
		cmp.Or(typeBase, DefaultProblemTypeBase))
	response.Headers.Set("Retry-After", strconv.Itoa(max(retryAfter, 1)))
	return response
}

// IsStalePlacement reports whether err (or an error it wraps) is the server's
// refusal of a call whose principal's shard is not on the node it ran on: SQLSTATE
// StalePlacementSQLState and the primary message StalePlacementMessage (another
// 0A000 is not). The principal's placement is stale: report it to the Router
// (ReportStalePlacement).
func IsStalePlacement(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == StalePlacementSQLState &&
		pgErr.Message == StalePlacementMessage
}
