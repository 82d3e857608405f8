package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// HeaderField is one HTTP header field; names compare case-insensitively.
type HeaderField struct {
	Name  string // the field name, as written
	Value string // the field value
}

// Headers are header fields in order, repeated names (Set-Cookie, Link) included.
type Headers []HeaderField

// Get returns the value of the first field with this name, and whether there was one.
func (h Headers) Get(name string) (string, bool) {
	for _, field := range h {
		if strings.EqualFold(field.Name, name) {
			return field.Value, true
		}
	}
	return "", false
}

// Set replaces every field with this name by one with value, appended last.
func (h *Headers) Set(name, value string) {
	kept := slices.DeleteFunc(*h, func(field HeaderField) bool {
		return strings.EqualFold(field.Name, name)
	})
	*h = append(kept, HeaderField{name, value})
}

// Response is an HTTP response produced by a handler or by the client.
type Response struct {
	// Status is the HTTP status code (100..599).
	Status int
	// Headers are the fields to send, in order.
	Headers Headers
	// Body is sent and stored byte for byte.
	Body []byte
	// Replayed is true for a stored response played back for a retry.
	Replayed bool
	// ResourceID is the id of what the request created, stored with the key.
	ResourceID string
	// OneTimeSecret marks a response that carries a secret: sent once, never stored.
	OneTimeSecret bool
	// Chunks, when not nil, makes the response a stream: the byte lengths of its
	// chunks, in order (Body is their concatenation). Stored as StreamChunksEntry;
	// WriteResponse writes one chunk per length, flushing after each.
	Chunks []int
	// StreamTooLarge marks a streamed response larger than the middleware keeps:
	// stored without its body, with NotKeptEntry alone; a retry gets 409.
	StreamTooLarge bool
}

// ProblemBody serializes an RFC 9457 problem object byte for byte as the C++
// client (nlohmann_json) does: members sorted (detail, status, title, type),
// no whitespace, non-ASCII characters as raw UTF-8.
func ProblemBody(status int, typeURI, title, detail string) []byte {
	var b strings.Builder
	b.WriteString(`{"detail":`)
	writeJSONString(&b, detail)
	b.WriteString(`,"status":`)
	b.WriteString(strconv.Itoa(status))
	b.WriteString(`,"title":`)
	writeJSONString(&b, title)
	b.WriteString(`,"type":`)
	writeJSONString(&b, typeURI)
	b.WriteByte('}')
	return []byte(b.String())
}

// writeJSONString escapes as nlohmann_json and Python's json (ensure_ascii off)
// do; encoding/json would also escape <, >, &, U+2028 and U+2029.
func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if escaped, ok := jsonEscapes[c]; ok {
			b.WriteString(escaped)
		} else if c < 0x20 {
			fmt.Fprintf(b, "\\u%04x", c) // the other control characters: \u0001
		} else {
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// jsonEscapes are the characters a JSON string escapes with a letter.
var jsonEscapes = map[byte]string{'"': `\"`, '\\': `\\`, '\b': `\b`, '\f': `\f`, '\n': `\n`,
	'\r': `\r`, '\t': `\t`}

// ProblemResponse is an application/problem+json response whose type is
// typeBase + the problem's slug.
func ProblemResponse(p Problem, detail, typeBase string) Response {
	return Response{
		Status:  p.Status,
		Headers: Headers{{"Content-Type", ProblemContentType}},
		Body:    ProblemBody(p.Status, typeBase+p.Slug, p.Title, detail),
	}
}

// answerRow is what the statement of begin, acquire or begin_batch returns
// besides the outcome: the key row's resource id and expiry, and the columns of
// idempotency.http_answer (NULL for "started").
type answerRow struct {
	resourceID   *string
	expiresEpoch *int64
	status       *int32
	headers      *string
	body         []byte
}

// response is the answer of idempotency.http_answer as a Response: its headers
// in order, a stored stream's StreamChunksEntry taken out as Chunks.
func (a answerRow) response() Response {
	response := Response{Body: nonNil(a.body), Headers: Headers{}}
	if a.status != nil {
		response.Status = int(*a.status)
	}
	if a.resourceID != nil {
		response.ResourceID = *a.resourceID
	}
	var pairs [][]string
	if a.headers != nil {
		_ = json.Unmarshal([]byte(*a.headers), &pairs) // the server's: pairs of two strings
	}
	lengths, streamed := "", false
	for _, pair := range pairs {
		if len(pair) != 2 {
			continue // never from http_answer; not worth a panic
		}
		if pair[0] == StreamChunksEntry {
			lengths, streamed = pair[1], true
			continue
		}
		response.Headers = append(response.Headers, HeaderField{pair[0], pair[1]})
	}
	_, response.Replayed = response.Headers.Get(ReplayHeader)
	if chunks, ok := parseChunkLengths(lengths, len(response.Body)); streamed && ok {
		response.Chunks = chunks
	} // else: sent as one body, which is all that can be done with it
	return response
}

// nonNil is body, or an empty body for nil (never NULL in a statement).
func nonNil(body []byte) []byte {
	if body == nil {
		return []byte{}
	}
	return body
}

// keptHeadersJSON is the JSON array of [name, value] pairs of the kept headers
// of a response, in their order; a stream's reserved entry comes last (a stream
// too large to keep has that entry alone).
func keptHeadersJSON(response Response, kept []string) string {
	chosen := [][]string{}
	if response.StreamTooLarge {
		kept = nil
		chosen = append(chosen, []string{NotKeptEntry, notKeptValue})
	}
	for _, field := range response.Headers {
		if strings.EqualFold(field.Name, ExpiresHeader) {
			continue // the key's, added to every answer: never stored
		}
		if slices.ContainsFunc(kept, func(wanted string) bool {
			return strings.EqualFold(field.Name, wanted)
		}) {
			chosen = append(chosen, []string{field.Name, field.Value})
		}
	}
	if response.Chunks != nil && !response.StreamTooLarge {
		chosen = append(chosen, []string{StreamChunksEntry, chunkLengths(response.Chunks)})
	}
	// Escaped as encoding/json does: the server stores jsonb, which keeps no escapes.
	text, _ := json.Marshal(chosen) // strings only: cannot fail
	return string(text)
}

// notKeptValue is the value stored with NotKeptEntry (the server reads only the name).
const notKeptValue = "stream-too-large"

// HTTPDate formats seconds since the Unix epoch as an IMF-fixdate
// ("Sun, 06 Nov 1994 08:49:37 GMT"), as ExpiresHeader's value.
func HTTPDate(epochSeconds int64) string {
	return time.Unix(epochSeconds, 0).UTC().Format(http.TimeFormat)
}

// The stored form of a streamed response (client/protocol.json's stream entries;
// stream.go captures and replays streams).

// chunkLengths formats Response.Chunks as the StreamChunksEntry value: "5,5,3".
func chunkLengths(chunks []int) string {
	parts := make([]string, len(chunks))
	for i, length := range chunks {
		parts[i] = strconv.Itoa(length)
	}
	return strings.Join(parts, ",")
}

// parseChunkLengths reads a StreamChunksEntry value; false when it is not a list
// of decimal lengths that add up to bodyLength.
func parseChunkLengths(text string, bodyLength int) ([]int, bool) {
	lengths := []int{}
	total := 0
	if text != "" {
		for _, part := range strings.Split(text, ",") {
			n, err := strconv.Atoi(part)
			if err != nil || n < 0 || part[0] == '+' || part[0] == '-' {
				return nil, false
			}
			lengths = append(lengths, n)
			total += n
		}
	}
	return lengths, total == bodyLength
}
