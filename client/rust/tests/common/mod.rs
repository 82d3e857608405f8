//! Shared by the integration tests: the run's cluster from PGHOST / PGPORT / PGUSER /
//! PGDATABASE (tests/integration/rust_client.sh makes a fresh database with the
//! extension), and a principal of its own for every test so they run in parallel.

#![allow(dead_code)] // each test file uses a part

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
