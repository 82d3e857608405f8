//! TLS (rustls) to a server that requires it: tests/integration/rust_client.sh starts a
//! throwaway cluster with `ssl = on` and a certificate of a CA of its own, and sets
//! IDEM_RUST_TLS_PORT (its port on 127.0.0.1), IDEM_RUST_TLS_CA (the CA's PEM) and
//! IDEM_RUST_TLS_OTHER_CA (another CA's PEM, which must be refused).

mod common;

use std::time::Duration;

use pg_idempotency::{
    Client, Connection, Done, Error, Idempotency, Key, LeaseOptions, Request, Response, Tls,
};
use tokio_postgres::config::SslMode;
use tokio_postgres::Config;

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

#[test]
fn a_file_without_a_certificate_is_refused() {
    let path = std::env::temp_dir().join(common::unique("empty.pem"));
    std::fs::write(&path, "not a certificate\n").unwrap();
    let refused = Tls::from_pem_file(&path);
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(refused, Err(Error::Protocol(_))));
    assert!(Tls::from_pem_file("/nonexistent/ca.pem").is_err());
}
