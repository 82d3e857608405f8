package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// protocolFile is client/protocol.json, the one table every client follows;
// read from the repository at test time.
type protocolFile struct {
	ProblemContentType       string   `json:"problem_content_type"`
	ProblemTypeBase          string   `json:"problem_type_base"`
	ReplayHeader             string   `json:"replay_header"`
	KeyHeader                string   `json:"key_header"`
	DefaultRetryAfterSeconds int      `json:"default_retry_after_seconds"`
	KeptHeaders              []string `json:"kept_headers"`
	StreamChunksEntry        string   `json:"stream_chunks_entry"`
	NotKeptEntry             string   `json:"not_kept_entry"`
	DefaultMaxStreamBytes    int      `json:"default_max_stream_bytes"`
	NotKeptDetail            string   `json:"not_kept_detail"`
	Routing                  struct {
		PlacementSQL           string `json:"placement_sql"`
		DefaultRefreshSeconds  int    `json:"default_refresh_seconds"`
		DefaultNodeDownSeconds int    `json:"default_node_down_seconds"`
		DefaultMaxPrincipals   int    `json:"default_max_principals"`
		StalePlacement         struct {
			SQLState string `json:"sqlstate"`
			Message  string `json:"message"`
		} `json:"stale_placement"`
	} `json:"routing"`
	DatabaseFault struct {
		Problem         string   `json:"problem"`
		Replayed        bool     `json:"replayed"`
		RetryAfter      bool     `json:"retry_after"`
		Detail          string   `json:"detail"`
		SQLStateClasses []string `json:"sqlstate_classes"`
		SQLStates       []string `json:"sqlstates"`
	} `json:"database_fault"`
	Problems map[string]struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Title  string `json:"title"`
	} `json:"problems"`
	Outcomes map[string]struct {
		RunHandler bool   `json:"run_handler"`
		Response   string `json:"response"`
		Problem    string `json:"problem"`
		Replayed   bool   `json:"replayed"`
		RetryAfter bool   `json:"retry_after"`
		Detail     string `json:"detail"`
	} `json:"outcomes"`
}

func TestTableMatchesProtocolJSONFieldByField(t *testing.T) {
	text, err := os.ReadFile("../protocol.json")
	if err != nil {
		t.Fatal(err)
	}
	var file protocolFile
	decoder := json.NewDecoder(bytesReader(text))
	if err := decoder.Decode(&file); err != nil {
		t.Fatal(err)
	}
	same := func(what string, got, want any) {
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Go has %#v, protocol.json %#v", what, got, want)
		}
	}
	same("problem_content_type", ProblemContentType, file.ProblemContentType)
	same("problem_type_base", DefaultProblemTypeBase, file.ProblemTypeBase)
	same("replay_header", ReplayHeader, file.ReplayHeader)
	same("key_header", KeyHeader, file.KeyHeader)
	same("default_retry_after_seconds", DefaultRetryAfterSeconds, file.DefaultRetryAfterSeconds)
	same("kept_headers", DefaultKeptHeaders, file.KeptHeaders)
	same("stream_chunks_entry", StreamChunksEntry, file.StreamChunksEntry)
	same("not_kept_entry", NotKeptEntry, file.NotKeptEntry)
	same("default_max_stream_bytes", DefaultMaxStreamBytes, file.DefaultMaxStreamBytes)
	same("not_kept_detail", NotKeptDetail, file.NotKeptDetail)
	same("routing.placement_sql", PlacementSQL, file.Routing.PlacementSQL)
	same("routing.default_refresh_seconds", DefaultRefreshSeconds, file.Routing.DefaultRefreshSeconds)
	same("routing.default_node_down_seconds", DefaultNodeDownSeconds,
		file.Routing.DefaultNodeDownSeconds)
	same("routing.default_max_principals", DefaultMaxPrincipals, file.Routing.DefaultMaxPrincipals)
	same("routing.stale_placement.sqlstate", StalePlacementSQLState,
		file.Routing.StalePlacement.SQLState)
	same("routing.stale_placement.message", StalePlacementMessage,
		file.Routing.StalePlacement.Message)
	var keys struct {
		Routing map[string]json.RawMessage `json:"routing"`
	}
	if err := json.Unmarshal(text, &keys); err != nil {
		t.Fatal(err)
	}
	routing := []string{}
	for key := range keys.Routing {
		routing = append(routing, key)
	}
	sort.Strings(routing)
	same("the keys of routing (each compared above)", routing, []string{"default_max_principals",
		"default_node_down_seconds", "default_refresh_seconds", "placement_sql", "stale_placement"})
	same("database_fault.problem", DatabaseFault.Problem, file.DatabaseFault.Problem)
	same("database_fault.replayed", DatabaseFault.Replayed, file.DatabaseFault.Replayed)
	same("database_fault.retry_after", DatabaseFault.RetryAfter, file.DatabaseFault.RetryAfter)
	same("database_fault.detail", DatabaseFault.Detail, file.DatabaseFault.Detail)
	same("database_fault.sqlstate_classes", DatabaseFault.SQLStateClasses,
		file.DatabaseFault.SQLStateClasses)
	same("database_fault.sqlstates", DatabaseFault.SQLStates, file.DatabaseFault.SQLStates)
	fault := DatabaseFaultResponse(file.DefaultRetryAfterSeconds, file.ProblemTypeBase)
	kind := file.Problems[file.DatabaseFault.Problem]
	same("database fault status", fault.Status, kind.Status)
	retryAfter, _ := fault.Headers.Get("Retry-After")
	same("database fault Retry-After", retryAfter, strconv.Itoa(file.DefaultRetryAfterSeconds))
	same("database fault body", string(fault.Body), string(ProblemBody(kind.Status,
		file.ProblemTypeBase+kind.Type, kind.Title, file.DatabaseFault.Detail)))
	same("number of problems", len(Problems), len(file.Problems))
	for name, want := range file.Problems {
		got, ok := Problems[name]
		if !ok {
			t.Errorf("problem %s is missing in Go", name)
			continue
		}
		same(name+".type", got.Slug, want.Type)
		same(name+".status", got.Status, want.Status)
		same(name+".title", got.Title, want.Title)
	}
	same("number of outcomes", len(Outcomes), len(file.Outcomes))
	for name, want := range file.Outcomes {
		got, ok := Outcomes[name]
		if !ok {
			t.Errorf("outcome %s is missing in Go", name)
			continue
		}
		same(name+".run_handler", got.RunHandler, want.RunHandler)
		same(name+".response", got.Response, want.Response)
		same(name+".problem", got.Problem, want.Problem)
		same(name+".replayed", got.Replayed, want.Replayed)
		same(name+".retry_after", got.RetryAfter, want.RetryAfter)
		same(name+".detail", got.Detail, want.Detail)
		if got.Problem != "" {
			if _, ok := Problems[got.Problem]; !ok {
				t.Errorf("outcome %s names an unknown problem %s", name, got.Problem)
			}
		}
	}
}

// Every outcome that does not run the handler is answered by the table itself.
func TestOutcomeResponsesFollowTheTable(t *testing.T) {
	status := int32(201)
	headers := `[["Location","/o/1"]]`
	stored := storedRow{status: &status, headers: &headers, body: []byte("b")}
	for name, rule := range Outcomes {
		response, ok := outcomeResponse(name, stored, "/p/", 1)
		if ok == rule.RunHandler {
			t.Errorf("%s: answered %v", name, ok)
			continue
		}
		if !ok {
			continue
		}
		_, replayed := response.Headers.Get(ReplayHeader)
		_, retry := response.Headers.Get("Retry-After")
		if replayed != rule.Replayed || response.Replayed != rule.Replayed ||
			retry != rule.RetryAfter {
			t.Errorf("%s: %+v", name, response)
		}
		if rule.Problem != "" && response.Status != Problems[rule.Problem].Status {
			t.Errorf("%s: status %d", name, response.Status)
		}
	}
}

// A Router built with zero options takes the routing defaults of protocol.json.
func TestRouterDefaultsAreTheTables(t *testing.T) {
	router, err := NewRouter(nilPool{}, nil, RouterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := router.Options()
	want := RouterOptions{PlacementSQL: PlacementSQL, Refresh: DefaultRefreshSeconds * time.Second,
		NodeDown: DefaultNodeDownSeconds * time.Second, MaxPrincipals: DefaultMaxPrincipals,
		LookupTimeout: DefaultLookupTimeout}
	if got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
}

// nilPool is a RouterPool that is never used.
type nilPool struct{}

func (nilPool) Acquire(context.Context) (*pgxpool.Conn, error) { return nil, errors.New("unused") }

func (nilPool) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("unused")
}
