package idempotency

import (
	"bytes"
	"io"
	"reflect"
	"testing"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// Bytes the C++ client (nlohmann_json) produces for the same problem; the
// conformance suite checks them against the C++ service.
const cppKeyReuse = `{"detail":"This Idempotency-Key was used for a different request;` +
	` use a new key for a new request.",` +
	`"status":422,"title":"Idempotency-Key was used for another request",` +
	`"type":"/problems/idempotency-key-reuse"}`

func TestProblemBodyMatchesTheCppClientBytes(t *testing.T) {
	reuse := Problem{Slug: "idempotency-key-reuse", Status: 422,
		Title: "Idempotency-Key was used for another request"}
	response := ProblemResponse(reuse, protocolOutcome(t, "mismatch").Detail,
		DefaultProblemTypeBase)
	if response.Status != 422 || string(response.Body) != cppKeyReuse {
		t.Fatalf("%d %s", response.Status, response.Body)
	}
	if !reflect.DeepEqual(response.Headers, Headers{{"Content-Type", "application/problem+json"}}) {
		t.Errorf("headers %+v", response.Headers)
	}
}

func TestProblemBodyEscapesLikeNlohmann(t *testing.T) {
	got := ProblemBody(400, "/p/x", "t",
		"quote \" backslash \\ tab \t ctl \x01 del \x7f é € <&> \u2028")
	want := `{"detail":"quote \" backslash \\ tab \t ctl \u0001 del ` + "\x7f é € <&> \u2028" +
		`","status":400,"title":"t","type":"/p/x"}`
	if string(got) != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
}

func TestHeadersCompareWithoutCaseAndSetReplaces(t *testing.T) {
	h := Headers{{"content-type", "a"}, {"X-A", "1"}, {"Content-Type", "b"}}
	if v, _ := h.Get("CONTENT-TYPE"); v != "a" {
		t.Errorf("get %q", v)
	}
	h.Set("Content-Type", "c")
	if !reflect.DeepEqual(h, Headers{{"X-A", "1"}, {"Content-Type", "c"}}) {
		t.Errorf("set %+v", h)
	}
	if _, ok := h.Get("missing"); ok {
		t.Error("found a missing header")
	}
}

func TestAnswerHeadersInOrderAndKeptHeadersJSON(t *testing.T) {
	text := `[["Link","</a>"],["Location","/o/1"],["Link","</b>"]]`
	pairs := answerRow{headers: &text}.response().Headers
	if !reflect.DeepEqual(pairs, Headers{{"Link", "</a>"}, {"Location", "/o/1"}, {"Link",
		"</b>"}}) {
		t.Errorf("pairs %+v", pairs)
	}
	response := Response{Headers: Headers{{"location", "/o/\"1\""}, {"X-Other", "no"},
		{"Content-Type", "é"}}}
	if got := keptHeadersJSON(response,
		DefaultKeptHeaders); got != `[["location","/o/\"1\""],["Content-Type","é"]]` {
		t.Errorf("kept %s", got)
	}
}
