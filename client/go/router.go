package idempotency

// Routing by principal under Citus: a request's whole transaction (the handler's
// writes and the key's begin/complete) goes to the node that holds the principal's
// shard, where Citus runs it locally.
//
// Correctness never depends on the Router: under Citus a node runs any principal's
// calls (Citus delegates them); routing saves that hop. After a shard move a stale
// cache sends requests to the old node until Refresh, or until a call there answers
// that the shard is not on that node (IsStalePlacement): ReportStalePlacement drops
// the placement, and the Middleware reruns the request on the principal's new route.

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultLookupTimeout bounds one placement lookup (not in protocol.json; the other
// routing defaults are generated from it: protocol_gen.go).
const DefaultLookupTimeout = time.Second

// RouterPool is a Router's target: a *pgxpool.Pool (a node's: see RoutedConfig).
type RouterPool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// RoutedConfig sets idempotency.routed = on on config's connections, keeping its other
// runtime parameters: for a node's pool, where Citus then plans a protocol call once.
func RoutedConfig(config *pgxpool.Config) *pgxpool.Config {
	config.ConnConfig.RuntimeParams["idempotency.routed"] = "on"
	return config
}

// RouterOptions configure a Router; zero values take the defaults.
type RouterOptions struct {
	// PlacementSQL is run on the default target with the principal as $1 and
	// returns zero or one row (nodename text, nodeport integer); "": PlacementSQL.
	PlacementSQL string
	// Refresh is how long a placement is cached (0: DefaultRefreshSeconds).
	Refresh time.Duration
	// NodeDown is how long a node is skipped after a connect failure (0: DefaultNodeDownSeconds).
	NodeDown time.Duration
	// MaxPrincipals bounds the cache; the least recently used go first (0: DefaultMaxPrincipals).
	MaxPrincipals int
	// LookupTimeout bounds one lookup; a slower one counts as failed (0: DefaultLookupTimeout).
	LookupTimeout time.Duration
}

// RouterCounters is what a Router did, for metrics.
type RouterCounters struct {
	// Lookups is the number of placement lookups run (cache misses).
	Lookups int64
	// LookupFailures counts lookups that failed (error, timeout): default target.
	LookupFailures int64
	// Routed counts requests routed to a named node.
	Routed int64
	// Defaulted counts requests sent to the default target: no placement, no pool, node
	// down, failed lookup, or a connect failure on the routed node (in Routed too).
	Defaulted int64
	// NodesMarkedDown counts connect failures of a node not down (skipped for NodeDown).
	NodesMarkedDown int64
	// StalePlacements counts ReportStalePlacement calls (placements dropped).
	StalePlacements int64
}

// Router sends each principal's transaction to the Citus node that holds its
// shard. Safe for concurrent use.
type Router struct {
	defaultPool RouterPool
	nodes       map[string]RouterPool
	options     RouterOptions

	mu       sync.Mutex
	cache    map[string]*list.Element // of *placement
	lru      *list.List               // front: the most recently used
	pending  map[string]*lookupCall
	down     map[string]time.Time
	counters RouterCounters
}

type placement struct {
	principal string
	node      string // "": no placement
	until     time.Time
}

type lookupCall struct {
	done chan struct{}
	node string
	ok   bool
}

var nodeName = regexp.MustCompile(`^.+:[0-9]+$`)

// NewRouter returns a router whose principals without a known placement go to
// defaultPool (the coordinator, or any node), and whose nodes map Citus's node
// name "nodename:nodeport" (as in pg_dist_node) to a pool that connects to it.
func NewRouter(defaultPool RouterPool, nodes map[string]RouterPool,
	options RouterOptions) (*Router, error) {
	if defaultPool == nil {
		return nil, errors.New("idempotency: NewRouter needs a default pool")
	}
	if options.Refresh < 0 || options.NodeDown < 0 || options.LookupTimeout < 0 ||
		options.MaxPrincipals < 0 {
		return nil, errors.New("idempotency: Router durations and MaxPrincipals must be >= 0")
	}
	options.PlacementSQL = cmp.Or(options.PlacementSQL, PlacementSQL)
	options.Refresh = cmp.Or(options.Refresh, DefaultRefreshSeconds*time.Second)
	options.NodeDown = cmp.Or(options.NodeDown, DefaultNodeDownSeconds*time.Second)
	options.MaxPrincipals = cmp.Or(options.MaxPrincipals, DefaultMaxPrincipals)
	options.LookupTimeout = cmp.Or(options.LookupTimeout, DefaultLookupTimeout)
	copied := make(map[string]RouterPool, len(nodes))
	for name, pool := range nodes {
		if !nodeName.MatchString(name) || pool == nil {
			return nil, fmt.Errorf("idempotency: a node is named \"host:port\" as Citus"+
				" names it and has a pool, not %q", name)
		}
		copied[name] = pool
	}
	return &Router{defaultPool: defaultPool, nodes: copied, options: options,
		cache: map[string]*list.Element{}, lru: list.New(),
		pending: map[string]*lookupCall{}, down: map[string]time.Time{}}, nil
}

// Options returns the router's settings, defaults filled in.
func (r *Router) Options() RouterOptions { return r.options }

// Counters returns a copy of the router's counters.
func (r *Router) Counters() RouterCounters {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counters
}

// Route returns where principal's request goes: the node's name and pool, or ""
// and the default pool; counted in Routed or Defaulted. The placement is looked
// up (on the default pool) when it is not cached or older than Refresh; a failed
// lookup is not an error: the default pool, counted in LookupFailures.
func (r *Router) Route(ctx context.Context, principal string) (string, RouterPool) {
	node, ok := r.placement(ctx, principal)
	r.mu.Lock()
	defer r.mu.Unlock()
	pool, known := r.nodes[node]
	until, down := r.down[node]
	if down && !time.Now().Before(until) {
		delete(r.down, node) // tried again
		down = false
	}
	if !ok || node == "" || !known || down {
		r.counters.Defaulted++
		return "", r.defaultPool
	}
	r.counters.Routed++
	return node, pool
}

// Acquire returns a connection for principal's request from its node's pool and
// the node's name ("": the default pool). When that connect fails, the failure is
// reported (ReportConnectFailure) and the connection comes from the default pool.
func (r *Router) Acquire(ctx context.Context, principal string) (*pgxpool.Conn, string, error) {
	node, pool := r.Route(ctx, principal)
	if node != "" {
		conn, err := pool.Acquire(ctx)
		if err == nil {
			return conn, node, nil
		}
		if ctx.Err() != nil { // the request is cancelled: not the node's fault
			return nil, "", err
		}
		r.ReportConnectFailure(node, principal)
		r.mu.Lock()
		r.counters.Defaulted++
		r.mu.Unlock()
	}
	conn, err := r.defaultPool.Acquire(ctx)
	return conn, "", err
}

// ReportConnectFailure tells the router that connecting to node failed (refused,
// DNS, timeout): the node is skipped for NodeDown, and principal's cached placement
// (when principal is not "") is dropped.
func (r *Router) ReportConnectFailure(node, principal string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if until, down := r.down[node]; !down || !now.Before(until) {
		r.counters.NodesMarkedDown++ // the node was not already down
	}
	r.down[node] = now.Add(r.options.NodeDown)
	if principal != "" {
		r.forget(principal)
	}
}

// ReportStalePlacement tells the router that a call of principal's request answered
// that its shard is not on its node (IsStalePlacement): the shard moved. Its cached
// placement is dropped (looked up again); no node is marked down. Counted in
// StalePlacements. The Middleware calls it itself.
func (r *Router) ReportStalePlacement(principal string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counters.StalePlacements++
	r.forget(principal)
}

// forget drops principal's cached placement (under r.mu).
func (r *Router) forget(principal string) {
	if element, ok := r.cache[principal]; ok {
		r.lru.Remove(element)
		delete(r.cache, principal)
	}
}

// Connections is a ConnSource for principal's requests (FromPool's routed twin).
func (r *Router) Connections(principal string) ConnSource {
	return pooled(func(ctx context.Context) (*pgxpool.Conn, error) {
		held, _, err := r.Acquire(ctx, principal)
		return held, err
	})
}

// Len returns the number of principals cached.
func (r *Router) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lru.Len()
}

// placement returns the cached node ("": no placement) or a fresh lookup's;
// ok false when the lookup failed. Concurrent callers for one principal share
// one lookup.
func (r *Router) placement(ctx context.Context, principal string) (string, bool) {
	r.mu.Lock()
	if element, ok := r.cache[principal]; ok {
		entry := element.Value.(*placement)
		if time.Now().Before(entry.until) {
			r.lru.MoveToFront(element)
			r.mu.Unlock()
			return entry.node, true
		}
		r.forget(principal)
	}
	if call, ok := r.pending[principal]; ok {
		r.mu.Unlock()
		select {
		case <-call.done:
			return call.node, call.ok
		case <-ctx.Done():
			return "", false
		}
	}
	call := &lookupCall{done: make(chan struct{})}
	r.pending[principal] = call
	r.counters.Lookups++
	r.mu.Unlock()

	call.node, call.ok = r.lookup(ctx, principal)
	r.mu.Lock()
	delete(r.pending, principal)
	if call.ok {
		entry := &placement{principal: principal, node: call.node,
			until: time.Now().Add(r.options.Refresh)}
		r.cache[principal] = r.lru.PushFront(entry)
		for r.lru.Len() > r.options.MaxPrincipals {
			oldest := r.lru.Back()
			r.lru.Remove(oldest)
			delete(r.cache, oldest.Value.(*placement).principal)
		}
	} else {
		r.counters.LookupFailures++ // not cached: the next request looks again
	}
	r.mu.Unlock()
	close(call.done)
	return call.node, call.ok
}

// lookup runs the placement query on the default pool, outside the router's lock.
func (r *Router) lookup(ctx context.Context, principal string) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, r.options.LookupTimeout)
	defer cancel()
	rows, err := r.defaultPool.Query(ctx, r.options.PlacementSQL, principal)
	if err != nil {
		return "", false
	}
	node, err := pgx.CollectOneRow(rows, func(row pgx.CollectableRow) (string, error) {
		var name *string
		var port *int64
		if err := row.Scan(&name, &port); err != nil || name == nil || port == nil {
			return "", err // a NULL name or port: no placement
		}
		return fmt.Sprintf("%s:%d", *name, *port), nil
	})
	return node, noRowIsNil(err) == nil // no row: no placement
}

// ConnSource hands the middleware an idle connection for one request and a
// function that gives it back.
type ConnSource func(ctx context.Context) (conn *pgx.Conn, release func(), err error)

// FromPool is a ConnSource on a pgxpool.Pool.
func FromPool(pool *pgxpool.Pool) ConnSource { return pooled(pool.Acquire) }

// pooled is the ConnSource of a pooled connection's acquire function.
func pooled(acquire func(ctx context.Context) (*pgxpool.Conn, error)) ConnSource {
	return func(ctx context.Context) (*pgx.Conn, func(), error) {
		held, err := acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return held.Conn(), held.Release, nil
	}
}
