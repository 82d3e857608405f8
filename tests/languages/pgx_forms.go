// The Go (pgx) forms of docs/languages.md, run as written there against a
// database that has the extension: each statement must run with plain Go
// values (no casts), optional arguments as nil, and the values must come back
// as the page says (fence int64, timestamps time.Time with their microseconds,
// interval from time.Duration).
//
//	cd tests/languages && go run pgx_forms.go "postgres://user@host:port/db"
//
// Built against pgx v5 (tests/languages/go.mod and go.sum pin it; modules from
// the Go module proxy). Prints ok / not ok lines and "N passed, N failed"; exits 1 on
// any failure.
package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

var passed, failed int

// check prints one result line and counts it.
func check(name string, err error, ok bool, detail string) {
	if err == nil && ok {
		passed++
		fmt.Println("ok - " + name)
		return
	}
	failed++
	fmt.Println("not ok - " + name)
	if err != nil {
		fmt.Printf("#   error: %v\n", err)
	} else {
		fmt.Printf("#   %s\n", detail)
	}
}

// beginRow is what the begin() form of the page scans.
type beginRow struct {
	outcome     string
	status      *int32
	respHeaders *string
	respBody    []byte
	resourceID  *string
	fence       int64
}

// begin runs the page's begin() form in q (a connection or a transaction).
func begin(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, principal, key string, body []byte, ttl any, wait any) (beginRow, error) {
	var r beginRow
	err := q.QueryRow(ctx,
		`SELECT outcome, response_status, response_headers::text, response_body, resource_id, fence
		   FROM idempotency.begin($1, $2, $3, idempotency.fingerprint($4, $5, $6), $7, $8)`,
		principal, key, "create_order", "POST", "/orders", body, ttl, wait,
	).Scan(&r.outcome, &r.status, &r.respHeaders, &r.respBody, &r.resourceID, &r.fence)
	return r, err
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pgx_forms.go CONNSTRING")
		os.Exit(2)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Args[1])
	if err != nil {
		fmt.Println("not ok - connect:", err)
		fmt.Println("0 passed, 1 failed")
		os.Exit(1)
	}
	defer conn.Close(ctx)
	run := fmt.Sprintf("go-%d", time.Now().UnixNano())
	principal := "pgx-" + run
	body := []byte(`{"item":"book","quantity":2}`)
	responseBody := []byte(`{"id":17}`)

	// The transactional protocol: begin, the effect, complete, commit; then a replay.
	tx, err := conn.Begin(ctx)
	if err != nil {
		check("BEGIN", err, false, "")
		os.Exit(1)
	}
	r, err := begin(ctx, tx, principal, "k1", body, nil, 2*time.Second)
	check("begin: untyped parameters, nil ttl, time.Duration wait: started", err, r.outcome == "started",
		"outcome "+r.outcome)
	check("begin: fence scans into int64", err, r.fence > 0, fmt.Sprintf("fence %d", r.fence))
	_, err = tx.Exec(ctx, `SELECT idempotency.complete($1, $2, $3, $4, $5, $6)`,
		principal, "k1", 201, responseBody, `{"Location":"/orders/17"}`, "17")
	check("complete: int status, []byte body, JSON string headers, text resource id", err, true, "")
	err = tx.Commit(ctx)
	check("COMMIT", err, true, "")

	r, err = begin(ctx, conn, principal, "k1", []byte(`{ "quantity": 2, "item": "book" }`), nil, nil)
	check("replay: the same request spelled differently", err,
		r.outcome == "replay" && r.status != nil && *r.status == 201 && bytes.Equal(r.respBody, responseBody) &&
			r.respHeaders != nil && strings.Contains(*r.respHeaders, `"/orders/17"`) &&
			r.resourceID != nil && *r.resourceID == "17",
		fmt.Sprintf("outcome %s status %v body %q", r.outcome, r.status, r.respBody))
	r, err = begin(ctx, conn, principal, "k1", []byte(`{"item":"pen"}`), nil, nil)
	check("mismatch: another body under the key", err, r.outcome == "mismatch", "outcome "+r.outcome)

	// The lease protocol: acquire, renew, complete with fence =>, and a stale fence.
	var fence int64
	var leaseUntil, createdAt time.Time
	err = conn.QueryRow(ctx,
		`SELECT fence, lease_until, created_at
		   FROM idempotency.acquire($1, $2, $3, idempotency.fingerprint($4, $5, $6), $7)`,
		principal, "k2", "refund", "POST", "/refunds", body, 30*time.Second,
	).Scan(&fence, &leaseUntil, &createdAt)
	check("acquire: time.Duration lease; fence int64, timestamps time.Time", err, fence > 0,
		fmt.Sprintf("fence %d", fence))
	var same bool
	err = conn.QueryRow(ctx,
		`SELECT lease_until = $3 AND created_at = $4 FROM idempotency.keys WHERE principal = $1 AND key = $2`,
		principal, "k2", leaseUntil, createdAt).Scan(&same)
	check("timestamps keep their microseconds (sent back, they equal the stored ones)", err, same,
		fmt.Sprintf("lease_until %s created_at %s", leaseUntil.Format(time.RFC3339Nano), createdAt.Format(time.RFC3339Nano)))
	var held bool
	err = conn.QueryRow(ctx, `SELECT idempotency.renew($1, $2, $3, $4)`, principal, "k2", fence, 45*time.Second).Scan(&held)
	check("renew: int64 fence, time.Duration lease", err, held, "renew returned false")
	err = conn.QueryRow(ctx, `SELECT idempotency.complete($1, $2, status => $3, fence => $4)`,
		principal, "k2", 200, fence).Scan(&held)
	check("complete(status =>, fence =>): int64 fence", err, held, "complete returned false")
	err = conn.QueryRow(ctx, `SELECT idempotency.complete($1, $2, status => $3, fence => $4)`,
		principal, "k2", 200, fence-1).Scan(&held)
	check("complete with a stale fence answers false", err, !held, "a stale fence completed")

	var released bool
	err = conn.QueryRow(ctx,
		`SELECT fence FROM idempotency.acquire($1, $2, $3, idempotency.fingerprint($4, $5, $6), $7, $8, $9)`,
		principal, "k3", "refund", "POST", "/refunds", body, nil, nil, nil).Scan(&fence)
	check("acquire: nil for every optional argument", err, fence > 0, "")
	err = conn.QueryRow(ctx, `SELECT idempotency.release($1, $2, $3)`, principal, "k3", fence).Scan(&released)
	check("release: int64 fence", err, released, "release returned false")

	var stored bool
	err = conn.QueryRow(ctx,
		`SELECT idempotency.save_final($1, $2, $3, idempotency.fingerprint($4, $5, $6), $7, $8, $9)`,
		principal, "k4", "create_order", "POST", "/orders", body, 409, []byte(`{"title":"conflict"}`), `{}`).Scan(&stored)
	check("save_final: JSON string headers", err, stored, "save_final returned false")

	// A key the server refuses is an error with its SQLSTATE.
	_, err = begin(ctx, conn, principal, "bad\nkey", body, nil, nil)
	check("a malformed key is an error (22P02)", nil, err != nil && strings.Contains(err.Error(), "22P02"),
		fmt.Sprintf("error %v", err))

	_, err = conn.Exec(ctx, `SELECT idempotency.forget($1, k) FROM unnest($2::text[]) AS k`,
		principal, []string{"k1", "k2", "k3", "k4"})
	check("forget the test's keys", err, true, "")

	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}
