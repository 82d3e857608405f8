//! Router (routing by principal under Citus) through `Client::handle`, on a fake
//! placement: three databases of the test cluster stand for the nodes (one as the default
//! target, one as a.test:5432, one as b.test:5432; each test makes its own and drops them),
//! and the placement query reads a route_fake table in the default one. Each keyed
//! request's handler writes an order: the key row and the order must land in the routed
//! database and nowhere else.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pg_idempotency::http::{PLACEMENT_SQL, STALE_PLACEMENT_MESSAGE};
use pg_idempotency::{Client, Error, Request, Response, Router, RouterCounters, RouterOptions};
use tokio_postgres::{Client as PgClient, Config, Transaction};

const FAKE: &str = "SELECT node_name, node_port FROM route_fake WHERE principal = $1";
const SCHEMA: &str = "CREATE TABLE orders (principal text NOT NULL, item text NOT NULL)";
const NODES: [&str; 3] = ["default", "a", "b"];
/// A stand-in for Citus's catalogs (the file's comment says what it does).
const FAKE_CITUS: &str = include_str!("../../../tests/scale-out/fake_citus.sql");

struct Env {
    admin: PgClient,
    names: Vec<String>,
    configs: Vec<Config>,
    clients: Vec<PgClient>,
}

/// The config of `dbname` on the test cluster, over TCP on 127.0.0.1.
fn tcp(dbname: &str, port: u16) -> Config {
    let mut config = Config::new(); // not common::config(): host() and port() add to a list
    config.host("127.0.0.1").port(port).dbname(dbname);
    config.user(common::config().get_user().unwrap_or("postgres"));
    config
}

fn test_port() -> u16 {
    common::config().get_ports()[0]
}

impl Env {
    async fn new(test: &str) -> Env {
        Env::with(test, false).await
    }

    /// `fake_citus`: node a's database runs tests/scale-out/fake_citus.sql right after its
    /// CREATE EXTENSION (before any session reads the key table's placement).
    async fn with(test: &str, fake_citus: bool) -> Env {
        let admin = common::connect_to(&common::config_for("postgres")).await;
        let (mut names, mut configs, mut clients) = (vec![], vec![], vec![]);
        for node in NODES {
            let (name, _) = common::own_database(&admin, &format!("route_{}_{}", test, node)).await;
            let config = tcp(&name, test_port());
            let client = common::connect_to(&config).await;
            if fake_citus && node == "a" {
                client.batch_execute(FAKE_CITUS).await.unwrap();
            }
            client.batch_execute(SCHEMA).await.unwrap();
            names.push(name);
            configs.push(config);
            clients.push(client);
        }
        clients[0]
            .batch_execute(
                "CREATE TABLE route_fake (principal text PRIMARY KEY, node_name text, \
                 node_port int)",
            )
            .await
            .unwrap();
        Env { admin, names, configs, clients }
    }

    async fn drop(self) {
        drop(self.clients);
        for name in &self.names {
            common::drop_database(&self.admin, name).await;
        }
    }

    fn router(&self, extra: Vec<(&str, Config)>, options: RouterOptions) -> Router {
        let mut nodes: HashMap<String, Config> = HashMap::new();
        nodes.insert("a.test:5432".into(), self.configs[1].clone());
        nodes.insert("b.test:5432".into(), self.configs[2].clone());
        for (name, config) in extra {
            nodes.insert(name.into(), config);
        }
        let mut options = options;
        if options.placement_sql == PLACEMENT_SQL {
            options.placement_sql = FAKE.into(); // the tests' fake, unless one is given
        }
        Router::new(self.configs[0].clone(), nodes, options).unwrap()
    }

    /// Places `who` on host:5432 (None: no placement).
    async fn place(&self, who: &str, host: Option<&str>) {
        let fake = &self.clients[0];
        fake.execute("DELETE FROM route_fake WHERE principal = $1", &[&who]).await.unwrap();
        if let Some(host) = host {
            fake.execute("INSERT INTO route_fake VALUES ($1, $2, 5432)", &[&who, &host])
                .await
                .unwrap();
        }
    }

    /// Where `who`'s rows are: "orders/keys" per database.
    async fn rows(&self, who: &str) -> String {
        let mut out = vec![];
        for (node, client) in NODES.iter().zip(&self.clients) {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM orders WHERE principal = $1), \
                     (SELECT count(*) FROM idempotency.keys WHERE principal = $1)",
                    &[&who],
                )
                .await
                .unwrap();
            out.push(format!("{} {}/{}", node, row.get::<_, i64>(0), row.get::<_, i64>(1)));
        }
        out.join(", ")
    }
}

/// One keyed request through the router: connect, handle (the handler writes an order and
/// answers its database's name), release. The response and the node it went to.
async fn send(router: &Router, who: &str, key: &str) -> (Response, Option<String>) {
    let request = Request::new(who, Some(key.to_string()), "POST", "/orders", Some(b"{}".to_vec()));
    let mut routed = router.connect(who).await.expect("a connection");
    let principal = who.to_string();
    let response = Client::default()
        .handle(&mut routed.conn, &request, |tx: &Transaction<'_>| {
            let principal = principal.clone();
            Box::pin(async move {
                let row = tx
                    .query_one(
                        "INSERT INTO orders VALUES ($1, 'book') RETURNING current_database()::text",
                        &[&principal],
                    )
                    .await?;
                Ok(Response::new(201, vec![], row.get::<_, String>(0)))
            })
        })
        .await
        .expect("the request succeeds");
    assert_eq!(response.status, 201);
    let node = routed.node.clone();
    router.release(routed);
    (response, node)
}

fn counters(lookups: u64, failures: u64, routed: u64, defaulted: u64, down: u64) -> RouterCounters {
    RouterCounters {
        lookups,
        lookup_failures: failures,
        routed,
        defaulted,
        nodes_marked_down: down,
        stale_placements: 0,
    }
}

fn key() -> String {
    common::unique("key")
}

#[tokio::test]
async fn placed_principals_run_on_their_node_and_the_rest_on_the_default() {
    let env = Env::new("places").await;
    let router = env.router(vec![], RouterOptions::default());
    let (p1, p2, p3) = (common::unique("p1"), common::unique("p2"), common::unique("p3"));
    env.place(&p1, Some("a.test")).await;
    env.place(&p2, Some("b.test")).await;
    let (first, node) = send(&router, &p1, "same").await;
    assert_eq!(
        (first.body.clone(), node),
        (env.names[1].clone().into_bytes(), Some("a.test:5432".into()))
    );
    send(&router, &p2, &key()).await;
    send(&router, &p3, &key()).await;
    assert_eq!(env.rows(&p1).await, "default 0/0, a 1/1, b 0/0");
    assert_eq!(env.rows(&p2).await, "default 0/0, a 0/0, b 1/1");
    assert_eq!(env.rows(&p3).await, "default 1/1, a 0/0, b 0/0");
    let (again, _) = send(&router, &p1, "same").await; // the retry finds its key on node a
    assert!(again.replayed && again.body == first.body);
    assert_eq!(env.rows(&p1).await, "default 0/0, a 1/1, b 0/0");
    assert_eq!(router.counters(), counters(3, 0, 3, 1, 0));
    env.drop().await;
}

#[tokio::test]
async fn one_lookup_per_refresh_and_a_move_is_followed() {
    let env = Env::new("refresh").await;
    // refresh is 1 s (not less): the three requests before it must fit in it on a loaded
    // machine.
    let refresh = Duration::from_secs(1);
    let router = env.router(vec![], RouterOptions { refresh, ..RouterOptions::default() });
    let who = common::unique("refresh");
    env.place(&who, Some("a.test")).await;
    let start = Instant::now();
    send(&router, &who, &key()).await;
    send(&router, &who, &key()).await;
    assert_eq!(router.counters().lookups, 1, "the second request used the cache");
    env.place(&who, Some("b.test")).await; // the shard moves
    send(&router, &who, &key()).await; // stale: the old node, still correct
    assert!(start.elapsed() < refresh, "the machine is too slow for this test");
    assert_eq!(env.rows(&who).await, "default 0/0, a 3/3, b 0/0");
    // The entry was cached after `start` and before now: it has expired after this sleep.
    tokio::time::sleep(refresh + Duration::from_millis(50)).await;
    send(&router, &who, &key()).await;
    assert_eq!(router.counters().lookups, 2, "looked up again after refresh");
    assert_eq!(env.rows(&who).await, "default 0/0, a 3/3, b 1/1");
    env.drop().await;
}

#[tokio::test]
async fn a_node_that_cannot_connect_is_skipped_then_tried_again() {
    let env = Env::new("down").await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut dead = tcp(&env.names[1], closed);
    dead.connect_timeout(Duration::from_secs(2)).password("pw-never-logged");
    let options = RouterOptions { node_down: Duration::from_secs(1), ..RouterOptions::default() };
    let router = env.router(vec![("c.test:5432", dead)], options);
    let who = common::unique("down");
    env.place(&who, Some("c.test")).await;
    let logs = common::Logs::default();
    let _logging = tracing::subscriber::set_default(logs.clone());
    assert_eq!(send(&router, &who, &key()).await.1, None);
    assert_eq!(router.counters().nodes_marked_down, 1);
    // Each marking is logged: the node's name and the error, never the password.
    let warned = logs.at("WARN");
    assert_eq!(warned.len(), 1, "{:?}", warned);
    assert!(warned[0].contains("node=c.test:5432"), "{}", warned[0]);
    assert!(warned[0].contains("error connecting to server: Connection refused"), "{}", warned[0]);
    assert!(!warned[0].contains("pw-never-logged"), "{}", warned[0]);
    send(&router, &who, &key()).await;
    assert_eq!(router.counters().nodes_marked_down, 1, "a node marked down is not tried");
    assert_eq!(router.counters().lookups, 2, "the failure dropped the cached placement");
    assert_eq!(logs.at("WARN").len(), 1, "not tried: not logged");
    tokio::time::sleep(Duration::from_millis(1050)).await;
    send(&router, &who, &key()).await;
    assert_eq!(router.counters().nodes_marked_down, 2, "tried again after node_down");
    assert_eq!(logs.at("WARN").len(), 2, "marked down again: logged again");
    assert_eq!(env.rows(&who).await, "default 3/3, a 0/0, b 0/0");
    assert_eq!(router.counters().defaulted, 3);
    env.drop().await;
}

#[tokio::test]
async fn a_placement_query_that_fails_or_times_out_goes_to_the_default() {
    let env = Env::new("fails").await;
    let cases = [
        ("SELECT node_name, node_port FROM no_such_table WHERE principal = $1", 1000),
        ("SELECT node_name, node_port FROM route_fake, pg_sleep(2) WHERE principal = $1", 150),
    ];
    for (sql, timeout) in cases {
        let options = RouterOptions {
            placement_sql: sql.into(),
            lookup_timeout: Duration::from_millis(timeout),
            ..RouterOptions::default()
        };
        let router = env.router(vec![], options);
        let who = common::unique("fails");
        env.place(&who, Some("a.test")).await;
        send(&router, &who, &key()).await;
        send(&router, &who, &key()).await;
        assert_eq!(router.counters(), counters(2, 2, 0, 2, 0), "{}", sql);
        assert_eq!(env.rows(&who).await, "default 2/2, a 0/0, b 0/0", "{}", sql);
    }
    env.drop().await;
}

#[tokio::test]
async fn a_node_without_a_target_goes_to_the_default() {
    let env = Env::new("unknown").await;
    let router = env.router(vec![], RouterOptions::default());
    let who = common::unique("unknown");
    env.place(&who, Some("z.test")).await;
    assert_eq!(send(&router, &who, &key()).await.1, None);
    assert_eq!(env.rows(&who).await, "default 1/1, a 0/0, b 0/0");
    assert_eq!(router.counters(), counters(1, 0, 0, 1, 0));
    env.drop().await;
}

#[tokio::test]
async fn the_cache_keeps_at_most_max_principals() {
    let env = Env::new("bound").await;
    let router =
        env.router(vec![], RouterOptions { max_principals: 2, ..RouterOptions::default() });
    let (p1, p2, p3) = (common::unique("b1"), common::unique("b2"), common::unique("b3"));
    env.place(&p1, Some("a.test")).await;
    assert_eq!(router.route(&p1).await.node.as_deref(), Some("a.test:5432"));
    router.route(&p2).await;
    router.route(&p1).await; // p1 used last: p2 is the oldest
    router.route(&p3).await;
    assert_eq!((router.cached(), router.counters().lookups), (2, 3));
    router.route(&p1).await;
    assert_eq!(router.counters().lookups, 3, "p1 stayed");
    router.route(&p2).await;
    assert_eq!(router.counters().lookups, 4, "p2 was evicted");
    // Concurrent requests of one principal share one lookup.
    let p4 = common::unique("b4");
    let (a, b, c) = tokio::join!(router.route(&p4), router.route(&p4), router.route(&p4));
    assert_eq!((a.node, b.node, c.node), (None, None, None));
    assert_eq!(router.counters().lookups, 5);
    env.drop().await;
}

#[test]
fn bad_settings_are_refused() {
    let config = common::config();
    let named = |name: &str| HashMap::from([(name.to_string(), config.clone())]);
    assert!(Router::new(config.clone(), named("a.test"), RouterOptions::default()).is_err());
    assert!(Router::new(config.clone(), named(":5432"), RouterOptions::default()).is_err());
    assert!(Router::new(config.clone(), named("a.test:5432"), RouterOptions::default()).is_ok());
    let none = RouterOptions { max_principals: 0, ..RouterOptions::default() };
    assert!(Router::new(config.clone(), HashMap::new(), none).is_err());
    let empty = RouterOptions { placement_sql: " ".into(), ..RouterOptions::default() };
    assert!(Router::new(config, HashMap::new(), empty).is_err());
}

/// Moves `who`'s shard away from node a (a shard-2 row in fake_citus_shard): a's locking
/// calls for `who` are refused from now on.
async fn move_away(env: &Env, who: &str) {
    let a = &env.clients[1];
    a.execute("INSERT INTO pg_catalog.fake_citus_shard VALUES ($1, 2)", &[&who]).await.unwrap();
}

/// `send` as the router's docs tell a caller to: a stale placement is reported, and a
/// request whose begin was refused (its handler has not run) runs once more on a new
/// connection. The result, the node of its last run and the handler's runs.
async fn send_following(
    router: &Router,
    who: &str,
) -> (Result<Response, Error>, Option<String>, u32) {
    let request = Request::new(who, Some(key()), "POST", "/orders", Some(b"{}".to_vec()));
    let (mut runs, mut again) = (0, true);
    loop {
        let before = runs;
        let mut routed = router.connect(who).await.expect("a connection");
        let principal = who.to_string();
        let result = Client::default()
            .handle(&mut routed.conn, &request, |tx: &Transaction<'_>| {
                runs += 1;
                let principal = principal.clone();
                Box::pin(async move {
                    let row = tx
                        .query_one(
                            "INSERT INTO orders VALUES ($1, 'book') \
                             RETURNING current_database()::text",
                            &[&principal],
                        )
                        .await?;
                    Ok(Response::new(201, vec![], row.get::<_, String>(0)))
                })
            })
            .await;
        let node = routed.node.clone();
        router.release(routed);
        match result {
            Err(error) if error.is_stale_placement() => {
                router.report_stale_placement(who);
                if runs > before || !std::mem::take(&mut again) {
                    return (Err(error), node, runs);
                }
            }
            other => return (other, node, runs),
        }
    }
}

#[tokio::test]
async fn a_stale_placement_is_dropped_and_a_refused_begin_runs_on_the_new_node() {
    let env = Env::with("stale", true).await;
    // refresh 60 s: only the refusal can refresh the placement.
    let router = env.router(vec![], RouterOptions::default());
    let who = common::unique("stale");
    env.place(&who, Some("a.test")).await;
    assert_eq!(send(&router, &who, &key()).await.1.as_deref(), Some("a.test:5432"));
    move_away(&env, &who).await; // the shard moves to b: a refuses, the placement says b
    env.place(&who, Some("b.test")).await;
    let (result, node, runs) = send_following(&router, &who).await;
    let response = result.expect("served on the new node");
    assert_eq!((response.status, node.as_deref(), runs), (201, Some("b.test:5432"), 1));
    assert_eq!(response.body, env.names[2].clone().into_bytes());
    assert_eq!(env.rows(&who).await, "default 0/0, a 1/1, b 1/1");
    let stale = |lookups, routed, stale_placements| RouterCounters {
        lookups,
        routed,
        stale_placements,
        ..RouterCounters::default()
    };
    assert_eq!(router.counters(), stale(2, 3, 1)); // routed: a, a (refused), b

    // The placement query still says a: the rerun is refused too, and the handler never ran.
    let other = common::unique("stale-twice");
    env.place(&other, Some("a.test")).await;
    move_away(&env, &other).await;
    let (result, _, runs) = send_following(&router, &other).await;
    assert!(matches!(&result, Err(e) if e.is_stale_placement()), "{:?}", result.err());
    assert_eq!(runs, 0);
    assert_eq!(env.rows(&other).await, "default 0/0, a 0/0, b 0/0");
    assert_eq!(router.counters(), stale(4, 5, 3));
    env.drop().await;
}

#[tokio::test]
async fn the_stale_placement_predicate_and_report_on_their_own() {
    let env = Env::with("report", true).await;
    // The predicate: node a's real refusal, in a database error or a handler's error.
    let who = common::unique("moved");
    move_away(&env, &who).await;
    let a = &env.clients[1];
    let claim = "SELECT * FROM idempotency.claim($1, 'k', '1 minute')";
    let refused = a.query(claim, &[&who]).await.unwrap_err();
    assert!(Error::Db(refused).is_stale_placement());
    let refused = a.query(claim, &[&who]).await.unwrap_err();
    assert!(Error::Body(Box::new(refused)).is_stale_placement());
    for (code, message) in [("0A000", "another feature"), ("40001", STALE_PLACEMENT_MESSAGE)] {
        let raise = format!(
            "DO $$ BEGIN RAISE EXCEPTION '{}' USING ERRCODE = '{}'; END $$",
            message.replace('\'', "''"),
            code
        );
        let error = Error::Db(a.batch_execute(&raise).await.unwrap_err());
        assert!(!error.is_stale_placement(), "{} {}", code, message);
    }
    assert!(!Error::Protocol(STALE_PLACEMENT_MESSAGE.into()).is_stale_placement());
    // The report drops the principal's entry and counts; no node is marked down.
    let router = env.router(vec![], RouterOptions::default());
    let placed = common::unique("report");
    env.place(&placed, Some("a.test")).await;
    router.route(&placed).await;
    assert_eq!(router.cached(), 1);
    router.report_stale_placement(&placed);
    router.report_stale_placement("never-routed"); // counted, nothing to drop
    assert_eq!(router.cached(), 0);
    assert_eq!(router.route(&placed).await.node.as_deref(), Some("a.test:5432"), "not down");
    let want =
        RouterCounters { lookups: 2, routed: 2, stale_placements: 2, ..RouterCounters::default() };
    assert_eq!(router.counters(), want);
    env.drop().await;
}

#[tokio::test]
async fn node_sessions_run_routed_and_keep_their_options_the_default_does_not() {
    let env = Env::new("routed").await;
    let mut a = env.configs[1].clone();
    a.options("-c work_mem=7MB"); // the user's own option, kept
    let router = env.router(vec![("a.test:5432", a)], RouterOptions::default());
    let (on_a, on_b, nowhere) = (common::unique("a"), common::unique("b"), common::unique("n"));
    env.place(&on_a, Some("a.test")).await;
    env.place(&on_b, Some("b.test")).await;
    let first = Some("-c idempotency.routed=on -c work_mem=7MB"); // a later -c of yours wins
    assert_eq!(router.route(&on_a).await.config.get_options(), first);
    let show = "SELECT coalesce(current_setting('idempotency.routed', true), 'off'), current_setting('work_mem')";
    for (who, node, want) in [(&on_a, "a", "on 7MB"), (&on_b, "b", "on"), (&nowhere, "-", "off")] {
        let mut routed = router.connect(who).await.unwrap();
        let row = routed.conn.client().query_one(show, &[]).await.unwrap();
        let (setting, work_mem): (String, String) = (row.get(0), row.get(1));
        let got = if want.ends_with("MB") { format!("{} {}", setting, work_mem) } else { setting };
        assert_eq!((node, got.as_str()), (node, want));
        assert_eq!(routed.node.is_some(), node != "-");
        router.release(routed);
    }
    env.drop().await;
}
