//! TLS (rustls) to a server that requires it: tests/integration/rust_client.sh starts a
//! throwaway cluster with `ssl = on` and a certificate of a CA of its own, and sets
//! IDEM_RUST_TLS_PORT (its port on 127.0.0.1), IDEM_RUST_TLS_CA (the CA's PEM) and
//! IDEM_RUST_TLS_OTHER_CA (another CA's PEM, which must be refused). The run's own cluster
//! (PGPORT) has no TLS: the Router's tests use it as a server without TLS.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use pg_idempotency::{
    Client, Connection, Done, Error, Idempotency, Key, LeaseOptions, Request, Response, Router,
    RouterCounters, RouterOptions, Tls,
};
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client as PgClient, Config, Transaction};

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{} is set by tests/integration/rust_client.sh", name))
}

/// The TLS cluster, TLS required (`sslmode=require`: no plain fallback).
fn tls_config() -> Config {
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(env("IDEM_RUST_TLS_PORT").parse().expect("a port"))
        .user("postgres")
        .dbname("postgres")
        .ssl_mode(SslMode::Require)
        .connect_timeout(Duration::from_secs(5));
    config
}

/// `dbname` on the TLS cluster, TLS required.
fn tls_config_for(dbname: &str) -> Config {
    let mut config = tls_config();
    config.dbname(dbname);
    config
}

fn tls() -> Tls {
    Tls::from_pem_file(env("IDEM_RUST_TLS_CA")).expect("the test CA")
}

#[tokio::test]
async fn the_calls_run_over_tls() {
    let options = LeaseOptions { tls: tls(), ..Idempotency::default_options() };
    let calls = Idempotency::new(tls_config(), options).unwrap();
    let key = Key::new(common::unique("tls"), "k");
    let first = calls.once(&key, None, || async { Ok::<_, String>(1) }).await.unwrap();
    assert_eq!(first, Done::Fresh(1));
    let again = calls.once(&key, None, || async { Ok::<_, String>(2) }).await.unwrap();
    assert_eq!(again, Done::Duplicate);
    let client = calls.pool().expect("a tokio-postgres pool").get().await.unwrap();
    let row = client
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "the pool's connections are TLS");
}

#[tokio::test]
async fn the_transactional_protocol_runs_over_tls() {
    let mut conn = Connection::new(tls().connect(&tls_config()).await.unwrap());
    let client = Client::default();
    let request = Request::new(
        common::unique("tls-tx"),
        Some("k".into()),
        "POST",
        "/orders",
        Some(b"{}".to_vec()),
    );
    for replayed in [false, true] {
        let response = client
            .handle(&mut conn, &request, |_tx| {
                Box::pin(async { Ok(Response::new(201, vec![], "{\"id\":1}")) })
            })
            .await
            .unwrap();
        assert_eq!((response.status, response.replayed), (201, replayed));
    }
}

#[tokio::test]
async fn a_server_certificate_of_another_ca_is_refused() {
    let other = Tls::from_pem_file(env("IDEM_RUST_TLS_OTHER_CA")).unwrap();
    let refused = other.connect(&tls_config()).await;
    assert!(matches!(refused, Err(Error::Db(_))), "refused: {:?}", refused.err());
    let options = LeaseOptions { tls: other, ..Idempotency::default_options() };
    let calls = Idempotency::new(tls_config(), options).unwrap();
    let key = Key::new(common::unique("tls-refused"), "k");
    let result = calls.once(&key, None, || async { Ok::<_, String>(()) }).await;
    assert!(result.is_err(), "no call without a verified server");
}

#[cfg(feature = "sqlx")]
#[tokio::test]
async fn sqlx_runs_over_tls_and_refuses_another_ca() {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
    let options = |ca: &str| {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(env("IDEM_RUST_TLS_PORT").parse().unwrap())
            .username("postgres")
            .database("postgres")
            .ssl_mode(PgSslMode::VerifyFull)
            .ssl_root_cert(env(ca))
    };
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options("IDEM_RUST_TLS_CA"))
        .await
        .unwrap();
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(ssl, "TLS");
    let calls = Idempotency::from_sqlx(pool, Idempotency::default_options()).unwrap();
    let key = Key::new(common::unique("sqlx-tls"), "k");
    let first = calls.once(&key, None, || async { Ok::<_, String>(1) }).await.unwrap();
    assert_eq!(first, Done::Fresh(1));
    let refused = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options("IDEM_RUST_TLS_OTHER_CA"))
        .await;
    assert!(refused.is_err(), "a server certificate of another CA is refused");
}

/// A stand-in for Citus's catalogs (the file's comment says what it does): every principal's
/// shard is shard 1, placed on group 1.
const FAKE_CITUS: &str = include_str!("../../../tests/scale-out/fake_citus.sql");
/// The node catalog that the default PLACEMENT_SQL joins, which fake_citus.sql does not
/// make: group 1 is the node "a.test:5432".
const FAKE_NODES: &str = "SET allow_system_table_mods = on; \
    CREATE TABLE pg_catalog.pg_dist_node (nodeid int, groupid int, nodename text, \
    nodeport int, isactive bool, noderole text); \
    RESET allow_system_table_mods; \
    INSERT INTO pg_catalog.pg_dist_node VALUES (1, 1, 'a.test', 5432, true, 'primary')";
const ORDERS: &str = "CREATE TABLE orders (principal text NOT NULL, item text NOT NULL)";

/// Two databases of the TLS cluster for a Router: the default target, where the placement
/// query reads the fake Citus catalogs, and the node a.test:5432 they name. Every session
/// of the test's routers carries `app` as its application_name.
struct TlsRoutes {
    admin: PgClient,
    default: String,
    node: String,
    app: String,
}

impl TlsRoutes {
    async fn new(test: &str) -> TlsRoutes {
        let admin = tls().connect(&tls_config()).await.unwrap();
        let mut names = vec![];
        for (node, setup) in
            [("default", format!("{}; {}", FAKE_CITUS, FAKE_NODES)), ("a", "".into())]
        {
            let name = common::unique(&format!("{}_{}", test, node)).replace('-', "_");
            admin.batch_execute(&format!("CREATE DATABASE {}", name)).await.unwrap();
            let setup = format!("CREATE EXTENSION idempotency; {}; {}", setup, ORDERS);
            let client = tls().connect(&tls_config_for(&name)).await.unwrap();
            client.batch_execute(&setup).await.unwrap();
            names.push(name);
        }
        let node = names.pop().unwrap();
        let default = names.pop().unwrap();
        TlsRoutes { admin, default, node, app: common::unique(test) }
    }

    /// `config` with the test's application_name.
    fn named(&self, mut config: Config) -> Config {
        config.application_name(&self.app);
        config
    }

    /// A router over `tls`, its default target `default`, a.test:5432 at `node`, and the
    /// default PLACEMENT_SQL (as a user's under Citus).
    fn router(&self, tls: Tls, default: Config, node: Config) -> Router {
        let nodes = HashMap::from([("a.test:5432".to_string(), self.named(node))]);
        let options = RouterOptions { tls, ..RouterOptions::default() };
        Router::new(self.named(default), nodes, options).unwrap()
    }

    /// (sessions, every one over TLS) of the test's routers on the TLS cluster.
    async fn sessions(&self) -> (i64, bool) {
        let row = self
            .admin
            .query_one(
                "SELECT count(*), coalesce(bool_and(s.ssl), true) FROM pg_stat_activity a \
                 JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
                &[&self.app],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    async fn drop(self) {
        for name in [&self.default, &self.node] {
            let drop = format!("DROP DATABASE {} WITH (FORCE)", name);
            self.admin.batch_execute(&drop).await.unwrap();
        }
    }
}

/// One keyed request through `router` as docs/rust.md shows it: connect, handle (the handler
/// writes an order and answers "its database, TLS or not"), release. The response and the
/// node it went to.
async fn route_one(router: &Router, request: &Request) -> (Response, Option<String>) {
    let mut routed = router.connect(&request.principal).await.expect("a connection");
    let principal = request.principal.clone();
    let response = Client::default()
        .handle(&mut routed.conn, request, |tx: &Transaction<'_>| {
            let principal = principal.clone();
            Box::pin(async move {
                let row = tx
                    .query_one(
                        "INSERT INTO orders VALUES ($1, 'book') RETURNING current_database() \
                         || ' ' || (SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid())",
                        &[&principal],
                    )
                    .await?;
                Ok(Response::new(201, vec![], row.get::<_, String>(0)))
            })
        })
        .await
        .expect("the request succeeds");
    let node = routed.node.clone();
    router.release(routed);
    (response, node)
}

fn keyed(who: &str) -> Request {
    Request::new(who, Some("k".into()), "POST", "/orders", Some(b"{}".to_vec()))
}

#[tokio::test]
async fn a_router_routes_over_tls() {
    let routes = TlsRoutes::new("tls_route").await;
    let router =
        routes.router(tls(), tls_config_for(&routes.default), tls_config_for(&routes.node));
    let request = keyed(&common::unique("tls-route"));
    let (first, node) = route_one(&router, &request).await;
    assert_eq!(node.as_deref(), Some("a.test:5432"), "placed by PLACEMENT_SQL over TLS");
    let answer = format!("{} true", routes.node).into_bytes();
    assert_eq!((first.status, first.replayed, &first.body), (201, false, &answer));
    let (again, node) = route_one(&router, &request).await; // the handler does not run
    assert_eq!(node.as_deref(), Some("a.test:5432"));
    assert_eq!((again.status, again.replayed, &again.body), (201, true, &answer));
    let counted = RouterCounters { lookups: 1, routed: 2, ..RouterCounters::default() };
    assert_eq!(router.counters(), counted);
    // The lookups' session on the default database and the node's idle one: both TLS.
    assert_eq!(routes.sessions().await, (2, true));
    routes.drop().await;
}

/// An error and its sources, as "error: cause: cause".
fn causes(error: &dyn std::error::Error) -> String {
    let mut said = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        said = format!("{}: {}", said, cause);
        source = cause.source();
    }
    said
}

/// The sessions with application_name `app` on the run's cluster (which has no TLS).
async fn plain_sessions(app: &str) -> i64 {
    let client = common::connect().await;
    let count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
    client.query_one(count, &[&app]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_router_that_requires_tls_refuses_a_server_without_it() {
    let routes = TlsRoutes::new("tls_refuse").await;
    // The run's cluster, over TCP, TLS required: the server answers that it has no TLS.
    let mut plain = Config::new();
    plain
        .host("127.0.0.1")
        .port(common::config().get_ports()[0])
        .user(common::config().get_user().unwrap_or("postgres"))
        .dbname(common::config().get_dbname().unwrap_or("postgres"))
        .password("pw-never-logged")
        .ssl_mode(SslMode::Require);
    // A node without TLS is refused, marked down, and never used in plain text: the request
    // is served by the default target, over TLS.
    let router = routes.router(tls(), tls_config_for(&routes.default), plain.clone());
    let request = keyed(&common::unique("tls-node-refused"));
    let logs = common::Logs::default();
    let logging = tracing::subscriber::set_default(logs.clone());
    let (response, node) = route_one(&router, &request).await;
    drop(logging);
    assert_eq!((node, response.body), (None, format!("{} true", routes.default).into_bytes()));
    assert_eq!(router.counters().nodes_marked_down, 1);
    assert_eq!(plain_sessions(&routes.app).await, 0);
    // The marking is logged once: the node's name and the TLS error, never the password.
    let warned = logs.at("WARN");
    assert_eq!(warned.len(), 1, "{:?}", warned);
    assert!(warned[0].contains("node=a.test:5432"), "{}", warned[0]);
    assert!(warned[0].contains("handshake: server does not support TLS"), "{}", warned[0]);
    assert!(!warned[0].contains("pw-never-logged"), "{}", warned[0]);

    // Every target without TLS: connect fails with the TLS error, nothing is sent in plain.
    let router = routes.router(tls(), plain.clone(), plain.clone());
    let refused = router.connect("tls-nowhere").await.map(|_| ()).unwrap_err();
    assert!(matches!(refused, Error::Db(_)), "{:?}", refused);
    let said = causes(&refused);
    assert!(said.ends_with("handshake: server does not support TLS"), "a clear error: {}", said);
    assert_eq!(router.counters().lookup_failures, 1, "the lookup was refused too");
    assert_eq!(plain_sessions(&routes.app).await, 0);

    // The TLS cluster with a certificate of another CA than the one trusted: refused.
    let other = Tls::from_pem_file(env("IDEM_RUST_TLS_OTHER_CA")).unwrap();
    let router =
        routes.router(other, tls_config_for(&routes.default), tls_config_for(&routes.node));
    let refused = router.connect("tls-other-ca").await.map(|_| ()).unwrap_err();
    let said = causes(&refused);
    assert!(said.contains("handshake: invalid peer certificate"), "a clear error: {}", said);
    // The first router's sessions alone (its lookups', its idle one to the default).
    assert_eq!(routes.sessions().await, (2, true));
    routes.drop().await;
}

#[test]
fn a_file_without_a_certificate_is_refused() {
    let path = std::env::temp_dir().join(common::unique("empty.pem"));
    std::fs::write(&path, "not a certificate\n").unwrap();
    let refused = Tls::from_pem_file(&path);
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(refused, Err(Error::Protocol(_))));
    assert!(Tls::from_pem_file("/nonexistent/ca.pem").is_err());
}
