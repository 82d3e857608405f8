//! Streamed responses through `Client::handle_stream` against a real cluster: the events
//! the transport gets (head, chunks as written, end), what is stored (`:chunks`,
//! `:not_kept`), the replay's chunks, 409 response-not-kept, non-final statuses, a client
//! that goes away.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use pg_idempotency::http::NOT_KEPT_DETAIL;
use pg_idempotency::{BoxError, Client, Connection, Error, Options, Request, Response};
use pg_idempotency::{StreamEvent, StreamWriter};
use tokio::sync::mpsc;
use tokio_postgres::Transaction;

fn request(principal: &str, key: &str) -> Request {
    Request::new(principal, Some(key.into()), "POST", "/orders/stream", Some(b"{}".to_vec()))
}

async fn setup() -> (tokio_postgres::Client, Connection) {
    let admin = common::connect().await;
    admin
        .batch_execute("CREATE TABLE IF NOT EXISTS rust_orders (principal text, item text)")
        .await
        .ok();
    (admin, Connection::new(common::connect().await))
}

/// The handler: one order, then `chunks` streamed with `status`.
async fn streamer(
    tx: &Transaction<'_>,
    who: String,
    status: u16,
    chunks: Vec<Vec<u8>>,
    out: StreamWriter,
) -> Result<Response, BoxError> {
    tx.execute("INSERT INTO rust_orders VALUES ($1, 'stream')", &[&who]).await?;
    out.start(
        status,
        vec![("Content-Type".into(), "text/plain".into()), ("X-No".into(), "1".into())],
    )
    .await?;
    for chunk in chunks {
        out.write(chunk).await?;
    }
    Ok(Response::default())
}

/// What the transport received: the first event, the chunks, whether `End` came.
#[derive(Debug)]
struct Received {
    first: Response,
    live: bool,
    chunks: Vec<Vec<u8>>,
    ended: bool,
}

async fn run(
    client: &Client,
    conn: &mut Connection,
    who: &str,
    key: &str,
    status: u16,
    chunks: &[&str],
    calls: Arc<AtomicU32>,
) -> (Result<Response, Error>, Received) {
    let (events, mut received) = mpsc::channel(64);
    let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.as_bytes().to_vec()).collect();
    let who_owned = who.to_string();
    let result = client
        .handle_stream(conn, &request(who, key), events, |tx, out| {
            calls.fetch_add(1, Ordering::SeqCst);
            let (who, chunks) = (who_owned.clone(), chunks.clone());
            Box::pin(async move { streamer(tx, who, status, chunks, out).await })
        })
        .await;
    let mut got =
        Received { first: Response::default(), live: false, chunks: vec![], ended: false };
    while let Ok(event) = received.try_recv() {
        match event {
            StreamEvent::Whole(response) => {
                got.chunks = pg_idempotency::stream::pieces(&response);
                got.first = response;
            }
            StreamEvent::Head(head) => (got.first, got.live) = (head, true),
            StreamEvent::Chunk(chunk) => got.chunks.push(chunk),
            StreamEvent::End => got.ended = true,
        }
    }
    (result, got)
}

async fn stored(admin: &tokio_postgres::Client, who: &str, key: &str) -> Option<(String, Vec<u8>)> {
    let sql = "SELECT response_headers::text, response_body FROM idempotency.keys \
               WHERE principal = $1 AND key = $2";
    admin.query_opt(sql, &[&who, &key]).await.unwrap().map(|r| (r.get(0), r.get(1)))
}

async fn orders(admin: &tokio_postgres::Client, who: &str) -> i64 {
    let sql = "SELECT count(*) FROM rust_orders WHERE principal = $1";
    admin.query_one(sql, &[&who]).await.unwrap().get(0)
}

fn bytes(chunks: &[&str]) -> Vec<Vec<u8>> {
    chunks.iter().map(|c| c.as_bytes().to_vec()).collect()
}

#[tokio::test]
async fn a_stream_is_sent_as_written_stored_and_replayed_with_the_same_chunks() {
    let (admin, mut conn) = setup().await;
    let (client, who, calls) = (Client::default(), common::unique("stream"), Arc::default());
    let (result, first) =
        run(&client, &mut conn, &who, "k", 200, &["00000", "1111", "222"], Arc::clone(&calls))
            .await;
    result.unwrap();
    assert!(first.live && first.ended, "{:?}", first);
    assert_eq!(first.chunks, bytes(&["00000", "1111", "222"]));
    assert!(first.first.header("Idempotency-Expires").is_some());
    let (headers, body) = stored(&admin, &who, "k").await.unwrap();
    assert_eq!(headers, r#"[["Content-Type", "text/plain"], [":chunks", "5,4,3"]]"#);
    assert_eq!(body, b"000001111222");

    let (_, replay) = run(&client, &mut conn, &who, "k", 200, &["x"], Arc::clone(&calls)).await;
    assert!(!replay.live);
    assert_eq!(replay.chunks, first.chunks, "same bytes, same boundaries");
    assert_eq!(replay.first.header("Idempotent-Replay"), Some("true"));
    assert_eq!(replay.first.header(":chunks"), None);
    assert_eq!(replay.first.header("X-No"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(orders(&admin, &who).await, 1);
}

#[tokio::test]
async fn past_the_limit_the_stream_is_sent_whole_not_kept_and_a_retry_is_409() {
    let (admin, mut conn) = setup().await;
    let client = Client::new(Options { max_stream_bytes: 8, ..Options::default() });
    let (who, calls) = (common::unique("stream-big"), Arc::default());
    let (_, first) =
        run(&client, &mut conn, &who, "big", 200, &["0000", "1111", "2"], Arc::clone(&calls)).await;
    assert!(first.ended);
    assert_eq!(first.chunks, bytes(&["0000", "1111", "2"]));
    let (headers, body) = stored(&admin, &who, "big").await.unwrap();
    assert_eq!((headers.as_str(), body.len()), (r#"[[":not_kept", "stream-too-large"]]"#, 0));
    let (_, retry) = run(&client, &mut conn, &who, "big", 200, &["x"], Arc::clone(&calls)).await;
    assert_eq!(retry.first.status, 409);
    assert_eq!(retry.first.header("Idempotent-Replay"), Some("true"));
    let problem: serde_json::Value = serde_json::from_slice(&retry.first.body).unwrap();
    assert_eq!(problem["type"], "/problems/response-not-kept");
    assert_eq!(problem["detail"], NOT_KEPT_DETAIL);
    assert_eq!((calls.load(Ordering::SeqCst), orders(&admin, &who).await), (1, 1));
}

#[tokio::test]
async fn a_non_final_stream_is_sent_but_not_stored_and_the_retry_runs_again() {
    let (admin, mut conn) = setup().await;
    let (client, who, calls) = (Client::default(), common::unique("stream-503"), Arc::default());
    let (_, first) = run(&client, &mut conn, &who, "k", 503, &["a", "b"], Arc::clone(&calls)).await;
    assert_eq!((first.first.status, first.ended), (503, true));
    assert!(stored(&admin, &who, "k").await.is_none());
    assert_eq!(orders(&admin, &who).await, 0, "rolled back");
    let (_, again) = run(&client, &mut conn, &who, "k", 200, &["c"], Arc::clone(&calls)).await;
    assert!(again.live);
    assert_eq!((calls.load(Ordering::SeqCst), orders(&admin, &who).await), (2, 1));
}

#[tokio::test]
async fn a_client_that_goes_away_stores_nothing() {
    let (admin, mut conn) = setup().await;
    let (client, who) = (Client::default(), common::unique("stream-gone"));
    let (events, received) = mpsc::channel(64);
    drop(received); // the transport is gone before the first chunk
    let who_owned = who.clone();
    let result = client
        .handle_stream(&mut conn, &request(&who, "g"), events, |tx, out| {
            let who = who_owned.clone();
            Box::pin(async move { streamer(tx, who, 200, bytes(&["a", "b"]), out).await })
        })
        .await;
    assert!(matches!(result, Err(Error::Body(_))), "{:?}", result);
    assert!(stored(&admin, &who, "g").await.is_none());
    assert_eq!(orders(&admin, &who).await, 0);
    // The connection serves the next request.
    let (result, _) = run(&client, &mut conn, &who, "g2", 200, &["a"], Arc::default()).await;
    result.unwrap();
}

#[tokio::test]
async fn a_handler_that_does_not_stream_is_answered_whole() {
    let (_admin, mut conn) = setup().await;
    let (client, who) = (Client::default(), common::unique("stream-whole"));
    let (events, mut received) = mpsc::channel(4);
    client
        .handle_stream(&mut conn, &request(&who, "w"), events, |_tx, _out| {
            Box::pin(async move { Ok(Response::new(201, vec![], "done")) })
        })
        .await
        .unwrap();
    match received.try_recv() {
        Ok(StreamEvent::Whole(response)) => {
            assert_eq!(
                (response.status, response.body.as_slice(), response.chunks),
                (201, &b"done"[..], None)
            )
        }
        other => panic!("{:?}", other),
    }
}
