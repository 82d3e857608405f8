//! Routing by principal under Citus: a request's whole transaction (the handler's writes
//! and the key's begin/complete) goes to the node that holds the principal's shard, where
//! Citus runs it locally.
//!
//! ```no_run
//! # async fn doc() -> Result<(), pg_idempotency::Error> {
//! use std::collections::HashMap;
//! use pg_idempotency::{Router, RouterOptions};
//!
//! let coordinator: tokio_postgres::Config = "host=10.0.0.1 dbname=shop".parse().unwrap();
//! let nodes = HashMap::from([
//!     ("10.0.0.5:5432".to_string(), "host=10.0.0.5 dbname=shop".parse().unwrap()),
//! ]);
//! let router = Router::new(coordinator, nodes, RouterOptions::default())?;
//! let mut routed = router.connect("user-42").await?; // the principal's node, or the default
//! // client.handle(&mut routed.conn, &request, handler).await ...
//! router.release(routed); // kept idle for the next request to that node
//! # Ok(()) }
//! ```
//!
//! Correctness never depends on the router: under Citus a node runs any principal's calls
//! (Citus delegates them); routing saves that hop. After a shard move a stale cache sends
//! requests to the old node until `refresh`, or until a locking call there answers that the
//! shard is not on that node ([`Error::is_stale_placement`]): then
//! [`Router::report_stale_placement`] drops the placement, and a request whose `begin` was
//! refused (its handler has not run) can run once more on a new connection from `connect`:
//!
//! ```no_run
//! # async fn doc(router: &pg_idempotency::Router, client: &pg_idempotency::Client,
//! #     request: &pg_idempotency::Request) -> Result<(), pg_idempotency::Error> {
//! use pg_idempotency::Response;
//!
//! let mut again = true;
//! let response = loop {
//!     let mut ran = false; // set by the handler: after it ran, a stale error is not rerun
//!     let mut routed = router.connect(&request.principal).await?;
//!     let result = client
//!         .handle(&mut routed.conn, request, |_tx| {
//!             ran = true;
//!             Box::pin(async move { Ok(Response::new(201, vec![], "{}")) })
//!         })
//!         .await;
//!     router.release(routed); // begin's transaction was rolled back
//!     match result {
//!         Err(error) if error.is_stale_placement() => {
//!             router.report_stale_placement(&request.principal); // looked up again
//!             if ran || !std::mem::take(&mut again) {
//!                 break Err(error); // the handler ran, or the rerun was refused too
//!             }
//!         }
//!         other => break other,
//!     }
//! }?;
//! # let _ = response; Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;
use tokio_postgres::{Client as PgClient, Config, Statement};

use crate::connect::Tls;
use crate::error::Error;
use crate::http::{
    DEFAULT_MAX_PRINCIPALS, DEFAULT_NODE_DOWN_SECONDS, DEFAULT_REFRESH_SECONDS, PLACEMENT_SQL,
};
use crate::transactional::Connection;

/// How long one lookup may take before it counts as failed (not in protocol.json).
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);
/// Settings of a `Router`.
#[derive(Clone, Debug)]
pub struct RouterOptions {
    /// Run on the default target with the principal as `$1`: zero or one row
    /// (nodename text, nodeport integer).
    pub placement_sql: String,
    /// How long a placement is cached.
    pub refresh: Duration,
    /// How long a node is skipped after a connect failure.
    pub node_down: Duration,
    /// The most principals cached; the least recently used go first.
    pub max_principals: usize,
    /// How long a lookup may take before it counts as failed.
    pub lookup_timeout: Duration,
    /// Idle connections `release` keeps per target for `connect` to reuse.
    pub max_idle_per_target: usize,
    /// How connections (to the nodes and for lookups) are secured.
    pub tls: Tls,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            placement_sql: PLACEMENT_SQL.to_string(),
            refresh: Duration::from_secs(DEFAULT_REFRESH_SECONDS),
            node_down: Duration::from_secs(DEFAULT_NODE_DOWN_SECONDS),
            max_principals: DEFAULT_MAX_PRINCIPALS,
            lookup_timeout: DEFAULT_LOOKUP_TIMEOUT,
            max_idle_per_target: 8,
            tls: Tls::Disabled,
        }
    }
}

/// What a `Router` did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouterCounters {
    /// Placement lookups run (cache misses).
    pub lookups: u64,
    /// Lookups that failed (error, timeout): those requests went to the default target.
    pub lookup_failures: u64,
    /// Requests routed to a named node.
    pub routed: u64,
    /// Requests sent to the default target: no placement, a node without a target, a node
    /// down, a failed lookup, or a connect failure on the routed node (counted in `routed` too).
    pub defaulted: u64,
    /// Connect failures of a node not already down (each skips it for `node_down`).
    pub nodes_marked_down: u64,
    /// `report_stale_placement` calls (the principal's shard moved; its placement dropped).
    pub stale_placements: u64,
}

/// Where a principal goes: the node's name ("host:port") and its config, or `None` and the
/// default target's.
#[derive(Debug)]
pub struct Route<'r> {
    /// The node's name as Citus names it; None: the default target.
    pub node: Option<String>,
    /// The config that connects to it.
    pub config: &'r Config,
}

/// A connection for one request and the node it goes to (`None`: the default target).
pub struct Routed {
    /// The connection: run `Client::handle` (or your own transaction) on it.
    pub conn: Connection,
    /// The node it is connected to; None: the default target.
    pub node: Option<String>,
}

/// A cache miss being looked up: `Some(node or None)`, or `None` when the lookup failed.
type Pending = Arc<OnceCell<Option<Option<String>>>>;

struct Cached {
    node: Option<String>,
    until: Instant,
    tick: u64,
}

#[derive(Default)]
struct State {
    cache: HashMap<String, Cached>,
    order: BTreeMap<u64, String>, // tick -> principal: the first is the least recently used
    tick: u64,
    pending: HashMap<String, Pending>,
    down: HashMap<String, Instant>,
    idle: HashMap<Option<String>, Vec<Connection>>,
    counters: RouterCounters,
}

/// Sends each principal's transaction to the Citus node of its shard. `Sync`: one per
/// process (the cache is behind a mutex, never held across an await).
pub struct Router {
    default: Config,
    nodes: HashMap<String, Config>,
    options: RouterOptions,
    state: Mutex<State>,
    lookup_conn: Mutex<Option<(Arc<PgClient>, Statement)>>,
}

impl Router {
    /// A router whose principals without a known placement go to `default` (the
    /// coordinator, or any node), and whose `nodes` map Citus's node name
    /// "nodename:nodeport" (as in pg_dist_node) to the config that connects to it; the
    /// router puts `-c idempotency.routed=on` first in a node's options (not the default's).
    pub fn new(
        default: Config,
        nodes: HashMap<String, Config>,
        options: RouterOptions,
    ) -> Result<Router, Error> {
        if options.placement_sql.trim().is_empty() || options.max_principals == 0 {
            return Err(Error::Protocol(
                "a Router needs a placement_sql and max_principals >= 1".into(),
            ));
        }
        for name in nodes.keys() {
            let port = name.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(Error::Protocol(format!(
                    "a node is named \"host:port\" as Citus names it, not {:?}",
                    name
                )));
            }
        }
        Ok(Router {
            default,
            nodes: nodes.into_iter().map(|(name, config)| (name, routed(config))).collect(),
            options,
            state: Mutex::new(State::default()),
            lookup_conn: Mutex::new(None),
        })
    }

    /// The settings.
    pub fn options(&self) -> &RouterOptions {
        &self.options
    }

    /// A copy of the counters.
    pub fn counters(&self) -> RouterCounters {
        self.lock().counters
    }

    /// The number of principals cached.
    pub fn cached(&self) -> usize {
        self.lock().cache.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Where `principal`'s request goes (counted in `routed` or `defaulted`); looked up when
    /// not cached or older than `refresh` (a failed lookup: the default, `lookup_failures`).
    pub async fn route(&self, principal: &str) -> Route<'_> {
        let node = self.placement(principal).await;
        let mut state = self.lock();
        if let Some((name, config)) = node.and_then(|n| self.nodes.get_key_value(&n)) {
            let down = state.down.get(name).copied();
            match down {
                Some(until) if Instant::now() < until => {}
                _ => {
                    state.down.remove(name); // tried again
                    state.counters.routed += 1;
                    return Route { node: Some(name.clone()), config };
                }
            }
        }
        state.counters.defaulted += 1;
        Route { node: None, config: &self.default }
    }

    /// A connection for `principal`'s request: an idle one of its node, or a new one. When
    /// connecting to the node fails, it is marked down (`report_connect_failure`) and logged
    /// (`tracing`, `WARN`, its name and the error, once per marking), and the connection
    /// goes to the default target. Give it back with `release`.
    pub async fn connect(&self, principal: &str) -> Result<Routed, Error> {
        let route = self.route(principal).await;
        if let Some(node) = route.node {
            if let Some(conn) = self.idle(&Some(node.clone())) {
                return Ok(Routed { conn, node: Some(node) });
            }
            match open(route.config, &self.options.tls).await {
                Ok(conn) => return Ok(Routed { conn, node: Some(node) }),
                Err(error) => {
                    if self.mark_down(&node, Some(principal)) {
                        tracing::warn!(
                            node = %node,
                            error = %with_causes(&error),
                            "pg_idempotency: connecting to the node failed; it is marked down \
                             for node_down, its requests go to the default target"
                        );
                    }
                    self.lock().counters.defaulted += 1;
                }
            }
        }
        let conn = match self.idle(&None) {
            Some(conn) => conn,
            None => open(&self.default, &self.options.tls).await?,
        };
        Ok(Routed { conn, node: None })
    }

    /// Keeps a connection from `connect` for the next request to its target (up to
    /// `max_idle_per_target`); a closed one is dropped.
    pub fn release(&self, routed: Routed) {
        if routed.conn.is_closed() {
            return;
        }
        let mut state = self.lock();
        let idle = state.idle.entry(routed.node).or_default();
        if idle.len() < self.options.max_idle_per_target {
            idle.push(routed.conn);
        }
    }

    fn idle(&self, target: &Option<String>) -> Option<Connection> {
        let mut state = self.lock();
        let idle = state.idle.get_mut(target)?;
        while let Some(conn) = idle.pop() {
            if !conn.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    /// Tells the router that connecting to `node` failed (refused, DNS, timeout): the node
    /// is skipped for `node_down`, and `principal`'s cached placement (if given) is dropped.
    pub fn report_connect_failure(&self, node: &str, principal: Option<&str>) {
        self.mark_down(node, principal);
    }

    /// Skips `node` for `node_down` and drops `principal`'s cached placement (if given):
    /// true when the node was not already down (counted in `nodes_marked_down`).
    fn mark_down(&self, node: &str, principal: Option<&str>) -> bool {
        let mut state = self.lock();
        let now = Instant::now();
        let until = state.down.insert(node.to_string(), now + self.options.node_down);
        let marked = until.is_none_or(|until| until <= now);
        if marked {
            state.counters.nodes_marked_down += 1;
        }
        if let Some(principal) = principal {
            forget(&mut state, principal);
        }
        marked
    }

    /// Tells the router that a call of `principal`'s request answered that its shard is not
    /// on its node ([`Error::is_stale_placement`]): the shard moved. Its cached placement is
    /// dropped (looked up again); no node is marked down. Counted in `stale_placements`.
    /// When the refused call was the key's `begin` (the handler has not run), the request
    /// may run once more on a new `connect` (the module's example).
    pub fn report_stale_placement(&self, principal: &str) {
        let mut state = self.lock();
        state.counters.stale_placements += 1;
        forget(&mut state, principal);
    }

    /// The cached node (None: no placement) or a fresh lookup's; None also when the lookup
    /// failed. Concurrent callers for one principal share one lookup.
    async fn placement(&self, principal: &str) -> Option<String> {
        let pending = {
            let mut state = self.lock();
            state.tick += 1;
            let tick = state.tick;
            let hit = match state.cache.get_mut(principal) {
                Some(cached) if Instant::now() < cached.until => {
                    let old = std::mem::replace(&mut cached.tick, tick);
                    Some((old, cached.node.clone()))
                }
                _ => None,
            };
            if let Some((old, node)) = hit {
                state.order.remove(&old);
                state.order.insert(tick, principal.to_string());
                return node;
            }
            state.pending.entry(principal.to_string()).or_default().clone()
        };
        let found = pending.get_or_init(|| self.lookup(principal)).await.clone();
        let mut state = self.lock();
        let first = matches!(state.pending.get(principal), Some(p) if Arc::ptr_eq(p, &pending));
        if first {
            // The first caller back files the answer (once per lookup).
            state.pending.remove(principal);
            match &found {
                Some(node) => self.cache(&mut state, principal, node.clone()),
                None => state.counters.lookup_failures += 1, // not cached: looked up again
            }
        }
        found.flatten()
    }

    fn cache(&self, state: &mut State, principal: &str, node: Option<String>) {
        state.tick += 1;
        let tick = state.tick;
        let until = Instant::now() + self.options.refresh;
        if let Some(old) = state.cache.insert(principal.to_string(), Cached { node, until, tick }) {
            state.order.remove(&old.tick);
        }
        state.order.insert(tick, principal.to_string());
        while state.cache.len() > self.options.max_principals {
            let oldest = match state.order.iter().next() {
                Some((&tick, _)) => tick,
                None => break,
            };
            if let Some(principal) = state.order.remove(&oldest) {
                state.cache.remove(&principal);
            }
        }
    }

    /// Runs the placement query on the default target (one connection kept for lookups);
    /// Some(node or None), or None when it failed or took longer than `lookup_timeout`.
    async fn lookup(&self, principal: &str) -> Option<Option<String>> {
        self.lock().counters.lookups += 1;
        let run = async {
            let (client, statement) = self.lookup_client().await?;
            let rows = client.query(&statement, &[&principal]).await?;
            Ok::<_, Error>(rows.first().and_then(node_of))
        };
        match tokio::time::timeout(self.options.lookup_timeout, run).await {
            Ok(Ok(node)) => Some(node),
            Ok(Err(_)) => None,
            Err(_) => {
                // The connection is stuck behind the slow query: a new one next time.
                *self.lookup_conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
                None
            }
        }
    }

    async fn lookup_client(&self) -> Result<(Arc<PgClient>, Statement), Error> {
        let kept = self.lookup_conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((client, statement)) = kept {
            if !client.is_closed() {
                return Ok((client, statement));
            }
        }
        let client = self.options.tls.connect(&self.default).await?;
        let statement = client.prepare(&self.options.placement_sql).await?;
        let pair = (Arc::new(client), statement);
        *self.lookup_conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(pair.clone());
        Ok(pair)
    }
}

/// Drops `principal`'s cached placement, if any.
fn forget(state: &mut State, principal: &str) {
    if let Some(cached) = state.cache.remove(principal) {
        state.order.remove(&cached.tick);
    }
}

/// `error` and the causes in its sources, each once ("database error: error performing TLS
/// handshake: server does not support TLS"): tokio-postgres says why in a source.
fn with_causes(error: &Error) -> String {
    let mut said = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_said = cause.to_string();
        if !said.ends_with(&cause_said) {
            said = format!("{}: {}", said, cause_said);
        }
        source = cause.source();
    }
    said
}

/// "nodename:nodeport" of a placement row; None for a row of NULLs.
fn node_of(row: &tokio_postgres::Row) -> Option<String> {
    let name: Option<String> = row.try_get(0).ok()?;
    let port: Option<i64> = match row.try_get::<_, Option<i32>>(1) {
        Ok(port) => port.map(i64::from),
        Err(_) => row.try_get(1).ok()?,
    };
    Some(format!("{}:{}", name?, port?))
}

/// `config` with `-c idempotency.routed=on` before its options (sql-reference.md, Settings).
fn routed(mut config: Config) -> Config {
    let options = format!("-c idempotency.routed=on {}", config.get_options().unwrap_or(""));
    config.options(options.trim_end());
    config
}

async fn open(config: &Config, tls: &Tls) -> Result<Connection, Error> {
    Ok(Connection::new(tls.connect(config).await?))
}
