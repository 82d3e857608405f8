//! begin_batch / complete_batch / claim_batch against the extension's batch functions
//! (0.8.0). Against an older extension these tests fail (42883: the functions do not
//! exist); they never skip.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use pg_idempotency::{
    claim_batch, BatchClaim, BatchCompletion, BatchOutcome, Begun, Client, DuplicateMode, Error,
    Options, Outcome, Request, Response,
};

fn request(principal: &str, key: &str, body: &str) -> Request {
    Request::new(principal, Some(key.into()), "POST", "/orders", Some(body.as_bytes().to_vec()))
}

fn summary(outcomes: &[BatchOutcome]) -> String {
    let parts: Vec<String> =
        outcomes.iter().map(|o| format!("{}:{}:{}", o.ord, o.key, o.outcome().name())).collect();
    parts.join(" ")
}

fn answer(outcome: &BatchOutcome) -> &Response {
    match &outcome.begun {
        Begun::Answer(_, response) => response,
        other => panic!("{} has no answer: {:?}", outcome.key, other),
    }
}

/// Completes one key with `body` through begin and complete in a transaction.
async fn complete_one(pg: &mut tokio_postgres::Client, client: &Client, req: &Request, body: &str) {
    let tx = pg.transaction().await.unwrap();
    assert!(matches!(client.begin(&tx, req).await.unwrap(), Begun::Started));
    let created = Response::new(201, vec![("Content-Type".into(), "text/plain".into())], body);
    client.complete(&tx, req, &created).await.unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn begin_batch_answers_each_key_and_complete_batch_stores_the_started_ones() {
    let mut pg = common::connect().await;
    let mut holder_pg = common::connect().await;
    let options = Options { duplicates: DuplicateMode::Reject, ..Options::default() };
    let (client, who) = (Client::new(options), common::unique("batch"));
    let book = "{\"item\":\"book\"}";
    complete_one(&mut pg, &client, &request(&who, "done", book), "done").await;
    complete_one(&mut pg, &client, &request(&who, "other", book), "other").await;
    let holder = holder_pg.transaction().await.unwrap();
    assert!(matches!(
        client.begin(&holder, &request(&who, "held", book)).await.unwrap(),
        Begun::Started
    ));
    let requests = vec![
        request(&who, "new-1", book),
        request(&who, "done", "{ \"item\" : \"b\\u006fok\" }"),
        request(&who, "other", "{\"item\":\"pen\"}"),
        request(&who, "held", book),
        request(&who, "new-2", book),
    ];
    let tx = pg.transaction().await.unwrap();
    let began = std::time::Instant::now();
    let outcomes = client.begin_batch(&tx, &requests).await.unwrap();
    assert!(began.elapsed() < Duration::from_secs(2), "reject mode does not wait for the held key");
    assert_eq!(
        summary(&outcomes),
        "1:new-1:started 2:done:replay 3:other:mismatch 4:held:in_progress 5:new-2:started"
    );
    let replay = answer(&outcomes[1]);
    assert_eq!((replay.status, replay.body.as_slice(), replay.replayed), (201, &b"done"[..], true));
    assert!(replay.header("Idempotency-Expires").is_some());
    assert_eq!(outcomes[1].response_status, Some(201));
    assert!(outcomes[1].created_at.is_some() && outcomes[1].expires_at.is_some());
    assert_eq!(answer(&outcomes[2]).status, 422);
    let busy = answer(&outcomes[3]);
    assert_eq!((busy.status, busy.header("Retry-After")), (409, Some("1")));

    let started: Vec<&Request> = vec![&requests[0], &requests[4]];
    let responses: Vec<Response> = started
        .iter()
        .map(|r| Response::new(201, vec![], r.key.clone().unwrap().into_bytes()))
        .collect();
    let items: Vec<(&Request, &Response)> = started.iter().copied().zip(responses.iter()).collect();
    let done = client.complete_batch(&tx, &items).await.unwrap();
    let completion = |ord, key: &str| BatchCompletion { ord, key: key.into(), completed: true };
    assert_eq!(done, vec![completion(1, "new-1"), completion(2, "new-2")]);
    tx.commit().await.unwrap();
    holder.rollback().await.unwrap();

    let tx = pg.transaction().await.unwrap();
    let again = client.begin_batch(&tx, &[requests[0].clone(), requests[4].clone()]).await;
    tx.commit().await.unwrap();
    let again = again.unwrap();
    assert_eq!(summary(&again), "1:new-1:replay 2:new-2:replay");
    assert_eq!(answer(&again[0]).body, b"new-1");
    assert_eq!(answer(&again[1]).body, b"new-2");
    assert!(matches!(again[0].outcome(), Outcome::Replay));
}

/// The SQLSTATE of a batch call's error, run in a transaction rolled back after.
async fn state_of<'c, F, Fut, T>(pg: &'c mut tokio_postgres::Client, call: F) -> Option<String>
where
    F: FnOnce(tokio_postgres::Transaction<'c>) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let tx = pg.transaction().await.unwrap();
    match call(tx).await {
        Ok(_) => None,
        Err(error) => error.sqlstate().map(|s| s.code().to_string()),
    }
}

#[tokio::test]
async fn batches_refuse_bad_input() {
    let mut pg = common::connect().await;
    let (client, who) = (Client::default(), common::unique("batch-bad"));
    let (c, w) = (&client, who.as_str());
    let duplicate = vec![request(w, "a", "{}"), request(w, "a", "{}")];
    let many: Vec<Request> = (0..1001).map(|i| request(w, &format!("k{}", i), "{}")).collect();
    let state = state_of(&mut pg, |tx| async move { c.begin_batch(&tx, &duplicate).await });
    assert_eq!(state.await.as_deref(), Some("22023"));
    let state = state_of(&mut pg, |tx| async move { c.begin_batch(&tx, &many).await });
    assert_eq!(state.await.as_deref(), Some("54000"));
    let state = state_of(&mut pg, |tx| async move { claim_batch(&tx, w, &["c", "c"], None).await });
    assert_eq!(state.await.as_deref(), Some("22023"));
    let req = request(w, "b", "{}");
    let state = state_of(&mut pg, |tx| async move {
        c.begin_batch(&tx, std::slice::from_ref(&req)).await?;
        c.complete_batch(&tx, &[(&req, &Response::new(500, vec![], ""))]).await
    });
    assert_eq!(state.await.as_deref(), Some("22023"));
    // Refused before the server: two principals, a request without a key.
    let tx = pg.transaction().await.unwrap();
    let two = [request(&who, "a", "{}"), request("someone-else", "b", "{}")];
    assert!(matches!(client.begin_batch(&tx, &two).await, Err(Error::Protocol(_))));
    let mut keyless = request(&who, "a", "{}");
    keyless.key = None;
    assert!(matches!(client.begin_batch(&tx, &[keyless]).await, Err(Error::Protocol(_))));
    assert!(client.begin_batch(&tx, &[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn claim_batch_claims_each_key_once_and_rolls_back_with_the_transaction() {
    let mut pg = common::connect().await;
    let who = common::unique("claim-batch");
    let claim = |ord, key: &str, claimed| BatchClaim { ord, key: key.into(), claimed };
    let tx = pg.transaction().await.unwrap();
    let first = claim_batch(&tx, &who, &["b", "a"], None).await.unwrap();
    assert_eq!(first, vec![claim(1, "b", true), claim(2, "a", true)]);
    tx.rollback().await.unwrap();
    let window = Some(Duration::from_secs(60));
    let again = claim_batch(&pg, &who, &["a", "b"], window).await.unwrap();
    assert_eq!(again, vec![claim(1, "a", true), claim(2, "b", true)]);
    let third = claim_batch(&pg, &who, &["c", "b"], None).await.unwrap();
    assert_eq!(third, vec![claim(1, "c", true), claim(2, "b", false)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_claim_batches_in_opposite_orders_do_not_deadlock() {
    let who = common::unique("claim-order");
    let keys: Vec<String> = (0..50).map(|i| format!("k{:02}", i)).collect();
    let mut runs = Vec::new();
    for reverse in [false, true] {
        let (who, mut keys) = (who.clone(), keys.clone());
        if reverse {
            keys.reverse();
        }
        runs.push(tokio::spawn(async move {
            let mut pg = common::connect().await;
            let tx = pg.transaction().await.unwrap();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let claims = claim_batch(&tx, &who, &refs, None).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            tx.commit().await.unwrap();
            claims.into_iter().map(|c| (c.key, c.claimed)).collect::<HashMap<_, _>>()
        }));
    }
    let (a, b) = (runs.remove(0).await.unwrap(), runs.remove(0).await.unwrap());
    for key in &keys {
        assert_ne!(a[key], b[key], "key {} claimed by exactly one batch", key);
    }
}
