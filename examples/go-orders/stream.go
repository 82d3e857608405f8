package main

import (
	"encoding/json"
	"math"
	"net/http"
	"strings"

	idempotency "github.com/pg-idempotency/pg-idempotency/client/go"
)

// streamCount is a member of a /orders/stream body: an integer in 1..most, or 0.
func streamCount(document map[string]any, name string, most float64) int {
	value, ok := document[name].(float64)
	if !ok || value != math.Trunc(value) || value < 1 || value > most {
		return 0
	}
	return int(value)
}

// streamOrders is POST /orders/stream: body {"chunks": n, "chunk_bytes": m}; inserts
// one order, then answers 200 text/plain as n chunks of m bytes (chunk i is the digit
// i % 10), each flushed on its own. The middleware keeps it up to MaxStreamBytes.
func (s *service) streamOrders(w http.ResponseWriter, r *http.Request) {
	state, body, ok := keyedCall(w, r)
	if !ok {
		return
	}
	var document map[string]any
	_ = json.Unmarshal(body, &document)
	chunks := streamCount(document, "chunks", 1000)
	chunkBytes := streamCount(document, "chunk_bytes", 65536)
	if chunks == 0 || chunkBytes == 0 {
		idempotency.WriteResponse(w, idempotency.ProblemResponse(idempotency.ProblemBodyInvalid,
			`The body must be a JSON object with "chunks" (1 to 1000) and "chunk_bytes"`+
				` (1 to 65536).`, idempotency.DefaultProblemTypeBase))
		return
	}
	_, err := state.Tx.Exec(r.Context(),
		"INSERT INTO orders (principal, item, quantity) VALUES ($1, 'stream', 1)",
		state.Request.Principal)
	if err != nil {
		send(w, internalError(err))
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	for i := 0; i < chunks; i++ {
		if _, err := w.Write([]byte(strings.Repeat(string(rune('0'+i%10)), chunkBytes))); err != nil {
			return // the client has gone
		}
		flusher.Flush()
	}
}
