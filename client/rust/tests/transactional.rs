//! The transactional protocol against a real cluster: begin/complete inside the
//! caller's transaction, handle() and its storage rules, the in-progress race, ttl
//! expiry, and push_unique.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pg_idempotency::{
    push_unique, push_unique_in, Begun, BoxError, Client, Connection, Error, Options,
};
use pg_idempotency::{Outcome, Request, Response};
use tokio_postgres::Transaction;

fn request(principal: &str, key: &str, body: &str) -> Request {
    Request::new(principal, Some(key.into()), "POST", "/orders", Some(body.as_bytes().to_vec()))
}

async fn setup() -> tokio_postgres::Client {
    let client = common::connect().await;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS rust_orders (principal text, item text);
             CREATE TABLE IF NOT EXISTS rust_jobs (principal text, job text)",
        )
        .await
        .ok(); // tests race to create them; one wins
    client
}

async fn count(client: &tokio_postgres::Client, table: &str, principal: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {} WHERE principal = $1", table);
    client.query_one(sql.as_str(), &[&principal]).await.unwrap().get(0)
}

#[tokio::test]
async fn begin_and_complete_inside_the_callers_transaction() {
    let mut pg = setup().await;
    let (client, who) = (Client::default(), common::unique("tx"));
    let req = request(&who, "k", "{\"item\":\"book\"}");
    let tx = pg.transaction().await.unwrap();
    assert!(matches!(client.begin(&tx, &req).await.unwrap(), Begun::Started));
    tx.execute("INSERT INTO rust_orders VALUES ($1, 'book')", &[&who]).await.unwrap();
    let created = Response::new(201, vec![("Location".into(), "/orders/1".into())], "{\"id\":1}");
    client.complete(&tx, &req, &created).await.unwrap();
    tx.commit().await.unwrap();

    let tx = pg.transaction().await.unwrap();
    let respelled = request(&who, "k", "{ \"item\" : \"b\\u006fok\" }");
    match client.begin(&tx, &respelled).await.unwrap() {
        Begun::Answer(Outcome::Replay, replay) => {
            assert_eq!((replay.status, replay.body.as_slice()), (201, &b"{\"id\":1}"[..]));
            assert_eq!(replay.header("Location"), Some("/orders/1"));
            assert_eq!(replay.header("Idempotent-Replay"), Some("true"));
        }
        other => panic!("expected a replay, got {:?}", other),
    }
    let other = request(&who, "k", "{\"item\":\"pen\"}");
    match client.begin(&tx, &other).await.unwrap() {
        Begun::Answer(Outcome::Mismatch, r) => assert_eq!(r.status, 422),
        other => panic!("expected a mismatch, got {:?}", other),
    }
    tx.commit().await.unwrap();
    assert_eq!(count(&pg, "rust_orders", &who).await, 1);
}

/// handle() with a handler that inserts an order and answers `status`.
async fn order(
    client: &Client,
    conn: &mut Connection,
    req: &Request,
    status: u16,
    runs: &AtomicU32,
) -> Response {
    let who = req.principal.clone();
    client
        .handle(conn, req, |tx: &Transaction<'_>| {
            let who = who.clone();
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            Box::pin(async move {
                tx.execute("INSERT INTO rust_orders VALUES ($1, 'book')", &[&who]).await?;
                Ok(Response::new(status, vec![], format!("{{\"run\":{}}}", n)))
            })
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn handle_stores_final_responses_and_reruns_the_others() {
    let pg = setup().await;
    let mut conn = Connection::new(common::connect().await);
    let (client, who, runs) = (Client::default(), common::unique("handle"), AtomicU32::new(0));
    // 500: rolled back, not stored; the retry runs and its 201 is stored.
    let flaky = request(&who, "flaky", "{}");
    assert_eq!(order(&client, &mut conn, &flaky, 500, &runs).await.status, 500);
    assert_eq!(count(&pg, "rust_orders", &who).await, 0);
    let created = order(&client, &mut conn, &flaky, 201, &runs).await;
    assert!(!created.replayed);
    let replay = order(&client, &mut conn, &flaky, 201, &runs).await;
    assert!(replay.replayed && replay.body == created.body);
    assert_eq!(count(&pg, "rust_orders", &who).await, 1);
    // A final 400: its writes rolled back, the answer stored and replayed.
    let invalid = request(&who, "invalid", "{}");
    assert_eq!(order(&client, &mut conn, &invalid, 400, &runs).await.status, 400);
    let again = order(&client, &mut conn, &invalid, 201, &runs).await;
    assert_eq!((again.status, again.replayed), (400, true));
    assert_eq!(count(&pg, "rust_orders", &who).await, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_handler_error_rolls_back_and_stores_nothing() {
    let pg = setup().await;
    let mut conn = Connection::new(common::connect().await);
    let (client, who, runs) = (Client::default(), common::unique("handler-err"), AtomicU32::new(0));
    let req = request(&who, "k", "{}");
    let who2 = who.clone();
    let failed = client
        .handle(&mut conn, &req, |tx: &Transaction<'_>| {
            let who = who2.clone();
            Box::pin(async move {
                tx.execute("INSERT INTO rust_orders VALUES ($1, 'book')", &[&who]).await?;
                Err::<Response, BoxError>("the handler failed".into())
            })
        })
        .await;
    assert!(matches!(failed, Err(Error::Body(_))));
    assert_eq!(common::state(&pg, &who, "k").await, None);
    assert_eq!(order(&client, &mut conn, &req, 201, &runs).await.status, 201);
    assert_eq!(count(&pg, "rust_orders", &who).await, 1);
}

#[tokio::test]
async fn keys_are_checked_and_a_held_key_is_409() {
    let mut pg = setup().await;
    let mut conn = Connection::new(common::connect().await);
    let options = Options { wait: Some(Duration::from_millis(200)), ..Options::default() };
    let (client, who, runs) = (Client::new(options), common::unique("held"), AtomicU32::new(0));
    let mut req = request(&who, "k", "{}");
    req.key = None;
    assert_eq!(order(&client, &mut conn, &req, 201, &runs).await.status, 400);
    req.key = Some("k".repeat(256));
    assert_eq!(order(&client, &mut conn, &req, 201, &runs).await.status, 400);
    // Another transaction holds the key: 409 with Retry-After once the wait runs out.
    req.key = Some("k".into());
    let holder = pg.transaction().await.unwrap();
    assert!(matches!(Client::default().begin(&holder, &req).await.unwrap(), Begun::Started));
    let busy = order(&client, &mut conn, &req, 201, &runs).await;
    assert_eq!((busy.status, busy.header("Retry-After")), (409, Some("1")));
    holder.rollback().await.unwrap();
    assert_eq!(order(&client, &mut conn, &req, 201, &runs).await.status, 201);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "400s and the 409 did not run the handler");
}

#[tokio::test]
async fn a_key_runs_again_after_its_ttl() {
    let _pg = setup().await;
    let mut conn = Connection::new(common::connect().await);
    let options = Options { ttl: Some(Duration::from_secs(1)), ..Options::default() };
    let (client, who, runs) = (Client::new(options), common::unique("ttl"), AtomicU32::new(0));
    let req = request(&who, "k", "{}");
    assert!(!order(&client, &mut conn, &req, 201, &runs).await.replayed);
    assert!(order(&client, &mut conn, &req, 201, &runs).await.replayed);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(!order(&client, &mut conn, &req, 201, &runs).await.replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn push_unique_enqueues_once_per_window() {
    let mut pg = setup().await;
    let who = common::unique("push");
    let insert = "INSERT INTO rust_jobs VALUES ($1, 'report')";
    // A push that rolls back leaves neither the job nor the key.
    let tx = pg.transaction().await.unwrap();
    assert!(push_unique_in(&tx, &who, "job-1", None, insert, &[&who]).await.unwrap());
    tx.rollback().await.unwrap();
    assert_eq!(count(&pg, "rust_jobs", &who).await, 0);
    assert!(push_unique(&mut pg, &who, "job-1", None, insert, &[&who]).await.unwrap());
    assert!(!push_unique(&mut pg, &who, "job-1", None, insert, &[&who]).await.unwrap());
    assert_eq!(count(&pg, "rust_jobs", &who).await, 1);
    // A short window: pushed again once it has passed.
    let window = Some(Duration::from_secs(1));
    assert!(push_unique(&mut pg, &who, "job-2", window, insert, &[&who]).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(push_unique(&mut pg, &who, "job-2", window, insert, &[&who]).await.unwrap());
    assert_eq!(count(&pg, "rust_jobs", &who).await, 3);
}
