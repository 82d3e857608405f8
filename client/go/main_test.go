package idempotency

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The tests run against a real cluster: IDEM_GO_TEST_DSN names a database that
// has the extension (tests/integration/go_client.sh makes one on the run's
// cluster); without it TestMain starts a throwaway cluster with
// scripts/pgcluster.sh on IDEM_GO_TEST_PORT (21410) and stops it at the end.
var testDSN string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	testDSN = os.Getenv("IDEM_GO_TEST_DSN")
	if testDSN != "" {
		return m.Run()
	}
	port := os.Getenv("IDEM_GO_TEST_PORT")
	if port == "" {
		port = "21410"
	}
	dir, err := os.MkdirTemp("", "idem-go-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	script, _ := filepath.Abs("../../scripts/pgcluster.sh")
	cluster := filepath.Join(dir, "pg")
	start := exec.Command(script, "start", cluster, port)
	start.Stdout, start.Stderr = os.Stderr, os.Stderr
	if err := start.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "cannot start a cluster:", err)
		return 1
	}
	defer func() { _ = exec.Command(script, "stop", cluster).Run() }()
	admin := fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres", port)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE DATABASE idem_go_test")
		conn.Close(ctx)
	}
	testDSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%s/idem_go_test", port)
	if err == nil {
		conn, err = pgx.Connect(ctx, testDSN)
	}
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE EXTENSION idempotency")
		conn.Close(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot prepare the test database:", err)
		return 1
	}
	return m.Run()
}

var principalCounter int64

// principal is a principal of its own for each test, so runs never collide.
func principal(t *testing.T) string {
	return fmt.Sprintf("go-%s-%d-%d", t.Name(), time.Now().UnixNano(),
		atomic.AddInt64(&principalCounter, 1))
}

// connect opens a connection to the test database, closed with the test.
func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testDSN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// newPool opens a pool on the test database, closed with the test.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testDSN)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// countingConn counts the writes of a connection: pgx writes each round trip's
// messages with one Write call.
type countingConn struct {
	net.Conn
	writes *int64
}

func (c countingConn) Write(p []byte) (int, error) {
	atomic.AddInt64(c.writes, 1)
	return c.Conn.Write(p)
}

// connectCounting opens a connection whose round trips are counted in writes.
func connectCounting(t *testing.T, writes *int64) *pgx.Conn {
	t.Helper()
	config, err := pgx.ParseConfig(testDSN)
	if err != nil {
		t.Fatal(err)
	}
	dialer := &net.Dialer{}
	config.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		inner, err := dialer.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: inner, writes: writes}, nil
	}
	conn, err := pgx.ConnectConfig(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// exec runs a statement on the test database on a connection of its own.
func exec1(t *testing.T, sql string, args ...any) {
	t.Helper()
	conn := connect(t)
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// scalarInt reads one integer from the test database.
func scalarInt(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	conn := connect(t)
	var n int64
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
