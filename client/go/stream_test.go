package idempotency

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// streamService is the middleware with a stream limit in front of handler.
func streamService(t *testing.T, maxStream int64, handler http.HandlerFunc) *httptest.Server {
	t.Helper()
	wrap := Middleware(MiddlewareOptions{Client: newClient(t, Options{}),
		Connections: FromPool(newPool(t)), MaxStreamBytes: maxStream,
		Principal: func(r *http.Request) (string, bool) {
			return r.Header.Get("X-Who"), r.Header.Get("X-Who") != ""
		}})
	server := httptest.NewServer(wrap(handler))
	t.Cleanup(server.Close)
	return server
}

// rawReply is a response read off the socket: the chunks as framed on the wire.
type rawReply struct {
	status   int
	header   http.Header
	chunks   []string
	complete bool // the last (empty) chunk arrived
}

// postRaw sends a POST on a fresh connection and reads the chunked framing itself.
func postRaw(t *testing.T, server *httptest.Server, path, who, key, body string) rawReply {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(server.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: test\r\nX-Who: %s\r\nIdempotency-Key: %s\r\n"+
		"Content-Length: %d\r\nConnection: close\r\n\r\n%s", path, who, key, len(body), body)
	reader := bufio.NewReader(conn)
	response, err := http.ReadResponse(reader, nil)
	if err != nil {
		t.Fatal(err)
	}
	reply := rawReply{status: response.StatusCode, header: response.Header}
	if len(response.TransferEncoding) == 0 { // not chunked: the body as one piece
		data, _ := io.ReadAll(response.Body)
		reply.chunks, reply.complete = []string{string(data)}, true
		return reply
	}
	// http.ReadResponse would undo the framing: read it from the same buffer instead.
	for {
		line, err := reader.ReadString('\n')
		if err != nil {
			return reply
		}
		size, err := strconv.ParseInt(strings.TrimSpace(line), 16, 64)
		if err != nil {
			t.Fatalf("chunk size %q", line)
		}
		if size == 0 {
			reply.complete = true
			return reply
		}
		chunk := make([]byte, size+2)
		if _, err := io.ReadFull(reader, chunk); err != nil {
			return reply
		}
		reply.chunks = append(reply.chunks, string(chunk[:size]))
	}
}

// streamHandler inserts one order, then writes ?n= chunks of ?m= bytes (digit i % 10),
// flushing after each; ?status= answers another status.
func streamHandler(w http.ResponseWriter, r *http.Request) {
	state := FromContext(r.Context())
	_, err := state.Tx.Exec(r.Context(), "INSERT INTO go_orders (principal, item) VALUES ($1, 's')",
		state.Request.Principal)
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	m, _ := strconv.Atoi(r.URL.Query().Get("m"))
	status := 200
	if s := r.URL.Query().Get("status"); s != "" {
		status, _ = strconv.Atoi(s)
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Not-Kept", "1")
	w.WriteHeader(status)
	for i := 0; i < n; i++ {
		_, _ = w.Write([]byte(strings.Repeat(strconv.Itoa(i%10), m)))
		w.(http.Flusher).Flush()
	}
}

func expectChunks(t *testing.T, what string, got rawReply, n, m int) {
	t.Helper()
	if !got.complete || len(got.chunks) != n {
		t.Fatalf("%s: complete %v, %d chunks, want %d", what, got.complete, len(got.chunks), n)
	}
	for i, chunk := range got.chunks {
		if chunk != strings.Repeat(strconv.Itoa(i%10), m) {
			t.Fatalf("%s: chunk %d is %q", what, i, chunk)
		}
	}
}

func TestStreamIsSentAsFlushedStoredAndReplayedWithTheSameChunks(t *testing.T) {
	ordersTable(t)
	server, who := streamService(t, 0, streamHandler), principal(t)
	first := postRaw(t, server, "/s?n=3&m=5", who, "k", "{}")
	expectChunks(t, "first", first, 3, 5)
	if first.status != 200 || first.header.Get(ReplayHeader) != "" ||
		first.header.Get(ExpiresHeader) == "" {
		t.Fatalf("first %+v", first)
	}
	stored := scalarText(t, "SELECT response_headers::text FROM idempotency.keys"+
		" WHERE principal = $1 AND key = 'k'", who)
	if stored != `[["Content-Type", "text/plain"], [":chunks", "5,5,5"]]` {
		t.Fatalf("stored headers %s", stored)
	}
	replay := postRaw(t, server, "/s?n=3&m=5", who, "k", "{}")
	expectChunks(t, "replay", replay, 3, 5)
	if replay.status != 200 || replay.header.Get(ReplayHeader) != "true" ||
		replay.header.Get(StreamChunksEntry) != "" || replay.header.Get("X-Not-Kept") != "" ||
		replay.header.Get("Content-Type") != "text/plain" {
		t.Fatalf("replay %+v", replay)
	}
	if orders(t, who) != 1 {
		t.Fatalf("%d orders", orders(t, who))
	}
}

func TestStreamPastTheLimitIsSentWholeAndARetryIs409(t *testing.T) {
	ordersTable(t)
	server, who := streamService(t, 65536, streamHandler), principal(t)
	first := postRaw(t, server, "/s?n=3&m=40000", who, "big", "{}")
	expectChunks(t, "first", first, 3, 40000)
	stored := scalarText(t, "SELECT response_headers::text || length(response_body)"+
		" FROM idempotency.keys WHERE principal = $1 AND key = 'big'", who)
	if stored != `[[":not_kept", "stream-too-large"]]0` {
		t.Fatalf("stored %s", stored)
	}
	retry := postRaw(t, server, "/s?n=3&m=40000", who, "big", "{}")
	if retry.status != 409 || retry.header.Get(ReplayHeader) != "true" ||
		len(retry.chunks) != 1 || !strings.Contains(retry.chunks[0], "/problems/response-not-kept") ||
		!strings.Contains(retry.chunks[0], "was streamed and was larger than") {
		t.Fatalf("retry %+v", retry)
	}
	if orders(t, who) != 1 {
		t.Fatalf("%d orders", orders(t, who))
	}
}

func TestStreamWithANonFinalStatusIsNotStored(t *testing.T) {
	ordersTable(t)
	server, who := streamService(t, 0, streamHandler), principal(t)
	first := postRaw(t, server, "/s?n=2&m=3&status=503", who, "k", "{}")
	expectChunks(t, "503", first, 2, 3)
	if first.status != 503 || orders(t, who) != 0 {
		t.Fatalf("503 %+v, %d orders", first, orders(t, who))
	}
	again := postRaw(t, server, "/s?n=2&m=3", who, "k", "{}")
	expectChunks(t, "retry", again, 2, 3)
	if again.status != 200 || again.header.Get(ReplayHeader) != "" || orders(t, who) != 1 {
		t.Fatalf("retry %+v, %d orders", again, orders(t, who))
	}
}

func TestStreamThatFailsMidwayIsBrokenOffAndNotStored(t *testing.T) {
	ordersTable(t)
	handler := func(w http.ResponseWriter, r *http.Request) {
		state := FromContext(r.Context())
		_, _ = state.Tx.Exec(r.Context(), "INSERT INTO go_orders (principal, item) VALUES ($1, 's')",
			state.Request.Principal)
		_, _ = w.Write([]byte("one"))
		w.(http.Flusher).Flush()
		_, _ = state.Tx.Exec(r.Context(), "DO $$ BEGIN RAISE EXCEPTION 'c' USING ERRCODE = '40001';"+
			" END $$")
		_, _ = w.Write([]byte("two"))
	}
	server, who := streamService(t, 0, handler), principal(t)
	got := postRaw(t, server, "/s", who, "k", "{}")
	if got.complete || len(got.chunks) < 1 || got.chunks[0] != "one" {
		t.Fatalf("broken stream %+v", got)
	}
	if orders(t, who) != 0 || scalarInt(t, "SELECT count(*) FROM idempotency.keys"+
		" WHERE principal = $1", who) != 0 {
		t.Fatal("a broken stream stored something")
	}
}

func TestStoredStreamEntriesAreReadBack(t *testing.T) {
	headers := `[["Content-Type","text/plain"],[":chunks","2,3"]]`
	response := answerRow{headers: &headers, body: []byte("aabbb")}.response()
	if len(response.Chunks) != 2 || response.Chunks[1] != 3 || len(response.Headers) != 1 {
		t.Fatalf("%+v", response)
	}
	if _, ok := parseChunkLengths("2,x", 5); ok {
		t.Fatal("a bad length was read")
	}
	if _, ok := parseChunkLengths("2,2", 5); ok {
		t.Fatal("lengths that do not add up were read")
	}
	kept := keptHeadersJSON(Response{Headers: Headers{{"Content-Type", "a/b"}}, Chunks: []int{2, 3}},
		DefaultKeptHeaders)
	if kept != `[["Content-Type","a/b"],[":chunks","2,3"]]` {
		t.Fatal(kept)
	}
	kept = keptHeadersJSON(Response{Headers: Headers{{"Content-Type", "a/b"}}, StreamTooLarge: true},
		DefaultKeptHeaders)
	if kept != `[[":not_kept","stream-too-large"]]` {
		t.Fatal(kept)
	}
}

// scalarText reads one text value from the test database.
func scalarText(t *testing.T, sql string, args ...any) string {
	t.Helper()
	conn := connect(t)
	var text string
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&text); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return text
}
