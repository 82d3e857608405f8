//! push_unique against a real cluster: true only for the call that enqueued, nothing
//! enqueued and the key left free by a rollback, and concurrent pushes of one key:
//! exactly one true. (tests/transactional.rs has the window and the rolled-back push.)

mod common;

use std::time::Duration;

use pg_idempotency::{push_unique, push_unique_in};

const INSERT: &str = "INSERT INTO rust_queue_jobs VALUES ($1, 'report')";

async fn setup() -> tokio_postgres::Client {
    let client = common::connect().await;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS rust_queue_jobs (principal text, job text)")
        .await
        .ok(); // tests race to create it; one wins
    client
}

async fn jobs(client: &tokio_postgres::Client, principal: &str) -> i64 {
    let sql = "SELECT count(*) FROM rust_queue_jobs WHERE principal = $1";
    client.query_one(sql, &[&principal]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_failed_enqueue_rolls_back_and_leaves_the_key_free() {
    let mut pg = setup().await;
    let who = common::unique("push-fail");
    let tx = pg.transaction().await.unwrap();
    let failed =
        push_unique_in(&tx, &who, "job", None, "INSERT INTO no_such_table VALUES (1)", &[]).await;
    assert_eq!(failed.unwrap_err().sqlstate().map(|s| s.code()), Some("42P01"));
    tx.rollback().await.unwrap();
    assert_eq!(common::state(&pg, &who, "job").await, None, "no key row");
    assert!(push_unique(&mut pg, &who, "job", None, INSERT, &[&who]).await.unwrap());
    assert_eq!(jobs(&pg, &who).await, 1);
}

/// One transaction pushes and holds the key; three more push the same key meanwhile:
/// they wait, and exactly one push in all is true (the first's when it commits, a
/// waiter's when it rolls back).
async fn concurrent_pushes(first_commits: bool) {
    let mut pg = setup().await;
    let who = common::unique("push-race");
    let tx = pg.transaction().await.unwrap();
    assert!(push_unique_in(&tx, &who, "job", None, INSERT, &[&who]).await.unwrap());
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let who = who.clone();
        waiters.push(tokio::spawn(async move {
            let mut conn = common::connect().await;
            push_unique(&mut conn, &who, "job", None, INSERT, &[&who]).await.unwrap()
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "the pushes wait for the holder");
    if first_commits {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    let mut trues = usize::from(first_commits);
    for waiter in waiters {
        trues += usize::from(waiter.await.unwrap());
    }
    assert_eq!(trues, 1, "exactly one push enqueued");
    assert_eq!(jobs(&pg, &who).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushes_one_true_when_the_first_commits() {
    concurrent_pushes(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pushes_one_true_when_the_first_rolls_back() {
    concurrent_pushes(false).await;
}
