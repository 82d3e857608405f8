//! Feature `sqlx`: the transactional protocol on a `sqlx::Transaction<'_, Postgres>` and
//! the framework-shaped calls over a `PgPool`, against the run's cluster (PGHOST, PGPORT,
//! PGUSER, PGDATABASE, which `PgConnectOptions::new` reads).
#![cfg(feature = "sqlx")]

mod common;

use std::time::Duration;

use pg_idempotency::{
    key_digest, Begun, CallError, Client, Done, Idempotency, Key, LeaseOptions, Outcome,
    Remembered, Request, Response,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

async fn pool() -> PgPool {
    PgPoolOptions::new().max_connections(4).connect_with(PgConnectOptions::new()).await.unwrap()
}

fn request(principal: &str, body: &str) -> Request {
    Request::new(principal, Some("k".into()), "POST", "/orders", Some(body.as_bytes().to_vec()))
}

/// One attempt as an application writes it with sqlx: begin, the write, complete, commit.
async fn attempt(pool: &PgPool, client: &Client, request: &Request) -> Response {
    let mut tx = pool.begin().await.unwrap();
    match client.begin_sqlx(&mut tx, request).await.unwrap() {
        Begun::Started => {
            sqlx::query("INSERT INTO sqlx_orders VALUES ($1)")
                .bind(&request.principal)
                .execute(&mut *tx)
                .await
                .unwrap();
            let created =
                Response::new(201, vec![("Location".into(), "/o/1".into())], "{\"id\":1}");
            client.complete_sqlx(&mut tx, request, &created).await.unwrap();
            tx.commit().await.unwrap();
            created
        }
        Begun::Answer(_, answer) | Begun::Rejected(answer) => {
            tx.rollback().await.unwrap();
            answer
        }
    }
}

#[tokio::test]
async fn the_transactional_protocol_on_a_sqlx_transaction() {
    let pool = pool().await;
    let create = "CREATE TABLE IF NOT EXISTS sqlx_orders (principal text)";
    sqlx::query(create).execute(&pool).await.unwrap();
    let client = Client::default();
    let who = common::unique("sqlx-tx");
    let first = attempt(&pool, &client, &request(&who, "{\"a\":1}")).await;
    assert_eq!((first.status, first.replayed), (201, false));
    let replay = attempt(&pool, &client, &request(&who, "{ \"a\": 1 }")).await;
    assert_eq!(
        (replay.status, replay.replayed, replay.body.as_slice()),
        (201, true, &b"{\"id\":1}"[..])
    );
    assert_eq!(replay.header("Location"), Some("/o/1"));
    let other = attempt(&pool, &client, &request(&who, "{\"a\":2}")).await;
    assert_eq!(other.status, 422);
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlx_orders WHERE principal = $1")
        .bind(&who)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 1, "the write committed once, with its key");
    let mut bad = request(&who, "{}");
    bad.key = Some("bad\u{e9}".into());
    let refused = attempt(&pool, &client, &bad).await;
    assert_eq!(refused.status, 400);
    let mut tx = pool.begin().await.unwrap();
    let begun = client.begin_sqlx(&mut tx, &request(&who, "{\"a\":1}")).await.unwrap();
    assert!(matches!(begun, Begun::Answer(Outcome::Replay, _)));
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn a_final_error_is_saved_after_the_rollback() {
    let pool = pool().await;
    let client = Client::default();
    let req = request(&common::unique("sqlx-final"), "{}");
    let mut tx = pool.begin().await.unwrap();
    assert!(matches!(client.begin_sqlx(&mut tx, &req).await.unwrap(), Begun::Started));
    tx.rollback().await.unwrap();
    let refused = Response::new(409, vec![], "{\"error\":\"sold out\"}");
    assert!(client.save_final_sqlx(&pool, &req, &refused).await.unwrap());
    let mut tx = pool.begin().await.unwrap();
    match client.begin_sqlx(&mut tx, &req).await.unwrap() {
        Begun::Answer(Outcome::Replay, answer) => assert_eq!(answer.status, 409),
        other => panic!("the saved 409 is replayed: {:?}", other),
    }
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn the_calls_over_a_pg_pool() {
    let pool = pool().await;
    let options =
        LeaseOptions { lease: Duration::from_millis(300), ..Idempotency::default_options() };
    let calls = Idempotency::from_sqlx(pool.clone(), options).unwrap();
    let principal = common::unique("sqlx-calls");
    let key = Key::new(&principal, "für alice@example.com ".repeat(20));
    let fresh = calls.once(&key, None, || async {
        tokio::time::sleep(Duration::from_millis(500)).await; // renewed meanwhile
        Ok::<_, String>(1)
    });
    assert_eq!(fresh.await.unwrap(), Done::Fresh(1));
    let dup = calls.once(&key, None, || async { Ok::<_, String>(2) }).await.unwrap();
    assert_eq!(dup, Done::Duplicate);
    let stored: String =
        sqlx::query_scalar("SELECT key FROM idempotency.keys WHERE principal = $1")
            .bind(&principal)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, key_digest(&key.material), "hashed, never the key");
    let remembered = Key::new(&principal, "r");
    let first = calls.remember(&remembered, None, || async { Ok::<_, String>(vec![1, 2]) });
    assert_eq!(first.await.unwrap(), Remembered::Fresh(vec![1, 2]));
    let again = calls.remember(&remembered, None, || async { Ok::<Vec<i32>, String>(vec![]) });
    assert_eq!(again.await.unwrap(), Remembered::Replayed(vec![1, 2]));
    let failing = Key::new(&principal, "failing");
    let failed = calls.commit_on_success(&failing, None, || async { Err::<(), _>("no") }).await;
    assert!(matches!(failed, Err(CallError::Body { error: "no", lease_lost: false })));
    let retried = calls.commit_on_success(&failing, None, || async { Ok::<_, &str>(()) });
    assert_eq!(retried.await.unwrap(), Done::Fresh(()), "released after the failure");
}
