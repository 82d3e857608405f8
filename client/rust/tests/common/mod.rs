//! Shared by the integration tests: the run's cluster from PGHOST / PGPORT / PGUSER /
//! PGDATABASE (tests/integration/rust_client.sh makes a fresh database with the
//! extension), and a principal of its own for every test so they run in parallel.

#![allow(dead_code)] // each test file uses a part

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio_postgres::{Client, Config, NoTls};

pub fn config() -> Config {
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let mut config = Config::new();
    config
        .host(var("PGHOST", "127.0.0.1"))
        .port(var("PGPORT", "5432").parse().expect("PGPORT is a port"))
        .user(var("PGUSER", "postgres"))
        .dbname(var("PGDATABASE", "postgres"));
    config
}

pub fn config_for(dbname: &str) -> Config {
    let mut config = config();
    config.dbname(dbname);
    config
}

pub async fn connect_to(config: &Config) -> Client {
    let (client, connection) = config.connect(NoTls).await.expect("connect to the test cluster");
    tokio::spawn(connection);
    client
}

pub async fn connect() -> Client {
    connect_to(&config()).await
}

/// A name no other test (or run) uses.
pub fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("rust-{}-{}", name, nanos)
}

/// (state, live) of a key from idempotency.lookup, None when there is no row.
pub async fn state(client: &Client, principal: &str, key: &str) -> Option<(String, bool)> {
    let row = client
        .query_opt("SELECT state, live FROM idempotency.lookup($1, $2)", &[&principal, &key])
        .await
        .expect("lookup");
    row.map(|r| (r.get(0), r.get(1)))
}

/// Terminates the backends with this application_name; how many there were.
pub async fn terminate(client: &Client, application_name: &str) -> i64 {
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&application_name],
        )
        .await
        .expect("terminate");
    row.get(0)
}

/// A fresh database with the extension, for a test that blocks others (locks the key
/// table, refuses connections); (its name, its config). Drop it with `drop_database`.
pub async fn own_database(admin: &Client, name: &str) -> (String, Config) {
    let db = unique(name).replace('-', "_");
    admin.batch_execute(&format!("CREATE DATABASE {}", db)).await.unwrap();
    let config = config_for(&db);
    connect_to(&config).await.batch_execute("CREATE EXTENSION idempotency").await.unwrap();
    (db, config)
}

pub async fn drop_database(admin: &Client, db: &str) {
    admin.batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", db)).await.unwrap();
}

/// The events logged through `tracing` while it is the thread's default subscriber
/// (`tracing::subscriber::set_default(logs.clone())`; a `#[tokio::test]` runs its tasks on
/// its own thread): one line each, "LEVEL message field=value ...".
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<String>>>);

impl Logs {
    /// The lines so far that start with `level` ("WARN").
    pub fn at(&self, level: &str) -> Vec<String> {
        let lines = self.0.lock().unwrap();
        lines.iter().filter(|line| line.starts_with(level)).cloned().collect()
    }
}

/// One event's fields, appended to its line.
struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl tracing::Subscriber for Logs {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(event.metadata().level().to_string());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
