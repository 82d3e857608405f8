package idempotency

import (
	"bytes"
	"cmp"
	"errors"
	"maps"
	"net/http"
	"slices"
)

// Streamed responses (client/protocol.json's stream entries): a handler behind
// the middleware streams by flushing (http.Flusher) between writes. From the
// first Flush on, the response goes to the client as it is produced: each
// flushed piece is one chunk on the wire (chunked transfer), captured on its
// way. When the handler returns, the key is completed with the concatenation
// as body and the chunks' lengths in the reserved StreamChunksEntry of the
// stored headers; a replay writes the same chunks, flushing after each. Past
// MaxStreamBytes the stream goes on to the client, nothing of its body is
// kept, and the key is completed with NotKeptEntry alone: a retry gets 409
// response-not-kept. A streamed response whose status is not final is not
// stored. The last chunk (the end of the chunked body) is sent only after the
// key's transaction committed: a client that sees a complete stream can rely
// on it being kept.

// captureWriter collects a handler's response instead of sending it, until the
// handler flushes: then it streams (streamState, below).
type captureWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	stream *streamState
}

// Header is the captured response's header map.
func (c *captureWriter) Header() http.Header { return c.header }

// WriteHeader captures the status (the first one counts).
func (c *captureWriter) WriteHeader(status int) {
	c.status = cmp.Or(c.status, status)
}

// Write captures body bytes, or queues them as the next chunk of a stream.
func (c *captureWriter) Write(p []byte) (int, error) {
	c.status = cmp.Or(c.status, http.StatusOK)
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
	headers := Headers{}
	for _, name := range slices.Sorted(maps.Keys(c.header)) {
		for _, value := range c.header[name] {
			headers = append(headers, HeaderField{name, value})
		}
	}
	return Response{Status: cmp.Or(c.status, http.StatusOK), Headers: headers, Body: c.body.Bytes()}
}

// errStreamBroken ends an attempt whose stream was already sent in part (the
// client has gone, or a statement failed): it is never rerun, nothing is stored.
var errStreamBroken = errors.New("idempotency: the streamed response could not be completed")

// streamState is the streaming part of a captureWriter.
type streamState struct {
	out      http.ResponseWriter
	limit    int64
	expires  *int64
	started  bool
	pending  bytes.Buffer // written since the last Flush: the next chunk
	kept     bytes.Buffer
	lengths  []int
	total    int64
	tooLarge bool
	gone     error // a write to the client failed
}

// Flush makes the response a stream: the first call sends the status and
// headers, every call sends what was written since the previous one as one chunk.
func (c *captureWriter) Flush() {
	s := c.stream
	if s == nil || s.out == nil {
		return // not behind the middleware's stream support: nothing to flush yet
	}
	if !s.started {
		s.started = true
		c.status = cmp.Or(c.status, http.StatusOK)
		for name, values := range c.header {
			for _, value := range values {
				s.out.Header().Add(name, value)
			}
		}
		if s.expires != nil {
			s.out.Header().Set(ExpiresHeader, HTTPDate(*s.expires))
		}
		s.out.WriteHeader(c.status)
		s.pending.Write(c.body.Bytes()) // written before the first Flush: the first chunk
		c.body.Reset()
	}
	s.sendChunk()
	if flusher, ok := s.out.(http.Flusher); ok && s.gone == nil {
		flusher.Flush()
	}
}

// sendChunk sends and captures the pending bytes as one chunk.
func (s *streamState) sendChunk() {
	if s.pending.Len() == 0 {
		return // an empty chunk would end the chunked body
	}
	chunk := s.pending.Bytes()
	s.total += int64(len(chunk))
	if !s.tooLarge && s.total > s.limit {
		s.tooLarge = true // never a truncated body: nothing of it is kept
		s.kept = bytes.Buffer{}
		s.lengths = nil
	}
	if !s.tooLarge {
		s.kept.Write(chunk)
		s.lengths = append(s.lengths, len(chunk))
	}
	if s.gone == nil {
		_, s.gone = s.out.Write(chunk)
	}
	s.pending.Reset()
}

// streamed is the response as the key stores it: the chunks' concatenation and
// lengths, or StreamTooLarge with no body.
func (s *streamState) streamed(response Response) Response {
	s.sendChunk() // written after the last Flush: the last chunk
	if s.tooLarge {
		response.StreamTooLarge = true
		response.Body = []byte{}
		return response
	}
	response.Body = s.kept.Bytes()
	response.Chunks = append([]int{}, s.lengths...) // never nil: a stream
	return response
}

// writeStreamed writes a stored stream: one chunk per stored length, flushed.
func writeStreamed(w http.ResponseWriter, response Response) {
	flusher, _ := w.(http.Flusher)
	at := 0
	for _, length := range response.Chunks {
		if length <= 0 || at+length > len(response.Body) {
			continue
		}
		if _, err := w.Write(response.Body[at : at+length]); err != nil {
			return
		}
		at += length
		if flusher != nil {
			flusher.Flush()
		}
	}
}
