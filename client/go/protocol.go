package idempotency

import (
	"net/http"
	"time"
)

// The one protocol table of every client (client/protocol.json in the
// repository), written out in Go. protocol_test.go compares each field with the
// JSON file, so a change on either side fails the tests until both agree.

// Problem is one RFC 9457 problem type the client answers with.
type Problem struct {
	// Slug is appended to the type base ("/problems/" + "idempotency-key-reuse").
	Slug string
	// Status is the HTTP status of responses of this type.
	Status int
	// Title is the fixed, human-readable title.
	Title string
}

// The problem types, named as in client/protocol.json.
var (
	ProblemKeyMissing = Problem{"idempotency-key-missing", 400,
		"Idempotency-Key header is missing"}
	ProblemKeyMalformed = Problem{"idempotency-key-malformed", 400,
		"Idempotency-Key header is malformed"}
	ProblemBodyInvalid = Problem{"request-body-invalid", 400,
		"Request body cannot be fingerprinted"}
	ProblemKeyReuse = Problem{"idempotency-key-reuse", 422,
		"Idempotency-Key was used for another request"}
	ProblemRequestInProgress = Problem{
		"request-in-progress", 409, "A request with this Idempotency-Key is in progress"}
	ProblemOneTimeSecret = Problem{
		"one-time-secret", 409, "The response to this request was sent once and not kept"}
	ProblemAlreadyProcessed = Problem{"request-already-processed", 409,
		"This request was already processed"}
	ProblemKeyExpired      = Problem{"idempotency-key-expired", 410, "Idempotency-Key has expired"}
	ProblemResponseNotKept = Problem{"response-not-kept", 409,
		"The response to this request was too large to keep"}
	ProblemDatabaseUnavailable = Problem{"database-unavailable", 503,
		"The database is unavailable"}
)

// Problems maps the names of client/protocol.json's "problems" to the types.
var Problems = map[string]Problem{
	"key_missing":          ProblemKeyMissing,
	"key_malformed":        ProblemKeyMalformed,
	"body_invalid":         ProblemBodyInvalid,
	"key_reuse":            ProblemKeyReuse,
	"request_in_progress":  ProblemRequestInProgress,
	"one_time_secret":      ProblemOneTimeSecret,
	"already_processed":    ProblemAlreadyProcessed,
	"key_expired":          ProblemKeyExpired,
	"response_not_kept":    ProblemResponseNotKept,
	"database_unavailable": ProblemDatabaseUnavailable,
}

// Constants of the HTTP mapping shared by every client.
const (
	// ProblemContentType is the Content-Type of every problem response.
	ProblemContentType = "application/problem+json"
	// DefaultProblemTypeBase prefixes the slug of a problem's type URI.
	DefaultProblemTypeBase = "/problems/"
	// ReplayHeader marks a response played back from the key store.
	ReplayHeader = "Idempotent-Replay"
	// KeyHeader is the request header that carries the key.
	KeyHeader = "Idempotency-Key"
	// ExpiresHeader tells until when the request's key counts: an IMF-fixdate
	// (RFC 9110), the key row's expires_at rounded down to the second. Never
	// stored as a kept header; every answer to a keyed request gets the stored
	// row's value.
	ExpiresHeader = "Idempotency-Expires"
	// ExpiresFormat is the format of ExpiresHeader's value.
	ExpiresFormat = "IMF-fixdate"
	// DefaultDuplicateMode is the duplicate mode of a client or call that names none.
	DefaultDuplicateMode = DuplicatesWait
	// DefaultRetryAfterSeconds is the Retry-After of a 409 for a key held by a transaction.
	DefaultRetryAfterSeconds = 1
	// StreamChunksEntry is the reserved entry of the stored headers of a streamed
	// response: its chunks' byte lengths, "5,5,3". No header can have this name;
	// it is never sent.
	StreamChunksEntry = ":chunks"
	// NotKeptEntry is the reserved entry of the stored headers of a stream larger
	// than MaxStreamBytes (value NotKeptValue): no body stored, a retry gets 409.
	NotKeptEntry = ":not_kept"
	// NotKeptValue is the value of NotKeptEntry.
	NotKeptValue = "stream-too-large"
	// DefaultMaxStreamBytes is the longest streamed body the middleware keeps.
	DefaultMaxStreamBytes = 1048576
	// NotKeptDetail is the detail of the 409 response-not-kept.
	NotKeptDetail = "The first response to this request was streamed and was larger than" +
		" this service keeps; it was sent once and not stored. Use a new key for a new request."
)

// DuplicateMode is what a duplicate of a running request does.
type DuplicateMode string

// The duplicate modes.
const (
	// DuplicatesWait waits for the first request (up to the wait), then replays.
	DuplicatesWait DuplicateMode = "wait"
	// DuplicatesReject answers 409 request-in-progress with Retry-After at once.
	DuplicatesReject DuplicateMode = "reject"
)

// DuplicateModes lists the modes, the default first.
var DuplicateModes = []DuplicateMode{DuplicatesWait, DuplicatesReject}

// HTTPDate formats seconds since the Unix epoch as an IMF-fixdate
// ("Sun, 06 Nov 1994 08:49:37 GMT").
func HTTPDate(epochSeconds int64) string {
	return time.Unix(epochSeconds, 0).UTC().Format(http.TimeFormat)
}

// DefaultKeptHeaders are the response headers stored with a key and replayed.
var DefaultKeptHeaders = []string{"Content-Type", "Location", "ETag", "Content-Location",
	"Last-Modified"}

// OutcomeRule says how one outcome of begin/acquire becomes an HTTP response.
type OutcomeRule struct {
	// RunHandler is true when the application's handler runs (outcome "started").
	RunHandler bool
	// Response is "stored" when the stored response is replayed, "" otherwise.
	Response string
	// Problem names the problem type (a key of Problems), "" when none.
	Problem string
	// Replayed is true when the answer carries Idempotent-Replay: true.
	Replayed bool
	// RetryAfter is true when the answer carries Retry-After.
	RetryAfter bool
	// Detail is the problem's detail text.
	Detail string
}

// Outcomes maps every outcome of idempotency.begin and idempotency.acquire to its answer.
var Outcomes = map[string]OutcomeRule{
	"started": {RunHandler: true},
	"replay":  {Response: "stored", Replayed: true},
	"mismatch": {Problem: "key_reuse",
		Detail: "This Idempotency-Key was used for a different request;" +
			" use a new key for a new request."},
	"in_progress": {Problem: "request_in_progress", RetryAfter: true,
		Detail: "A request with this Idempotency-Key is still being processed; retry later."},
	"secret_replay": {Problem: "one_time_secret", Replayed: true,
		Detail: "The first response to this request carried a secret and was not kept;" +
			" create a new one with a new key."},
	// A retry of a key that expired under an on_expiry 'refuse' policy (a tombstone):
	// 410, with Idempotency-Expires set to the (past) expiry begin/acquire returned.
	"expired": {Problem: "key_expired",
		Detail: "This Idempotency-Key expired and its response is no longer kept;" +
			" the request was not run again. Use a new key for a new request."},
}

// detailAlreadyProcessed answers a duplicate under the lease policies once and
// commit_on_success, whose results are not kept (not an outcome of the table).
const detailAlreadyProcessed = "A request with this Idempotency-Key was already processed; " +
	"its result is not kept."

// DatabaseFault is protocol.json's database_fault: the one answer to a database
// fault (fault.go), a problem with Retry-After, never replayed.
var DatabaseFault = struct {
	Problem         string
	Replayed        bool
	RetryAfter      bool
	Detail          string
	SQLStateClasses []string
	SQLStates       []string
}{
	Problem:    "database_unavailable",
	RetryAfter: true,
	Detail: "The database failed or could not be reached while this request was processed." +
		" Retry it with the same Idempotency-Key: it runs once, or its stored response is replayed.",
	// Connection exception; operator intervention (57P01 admin shutdown, 57P02 crash
	// shutdown, 57P03 cannot connect now, 57014 cancel).
	SQLStateClasses: []string{"08", "57"},
	// Too many connections.
	SQLStates: []string{"53300"},
}
