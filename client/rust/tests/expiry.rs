//! The key's expiry header (Idempotency-Expires) and the duplicate modes (wait or
//! reject) through `Client::handle` against a real cluster.

mod common;

use std::time::{Duration, Instant};

use pg_idempotency::http::{http_date, DEFAULT_KEPT_HEADERS, EXPIRES_HEADER};
use pg_idempotency::{Begun, Client, Connection, DuplicateMode, Options, Request, Response};
use tokio_postgres::Transaction;

const ORDER: &str = "{\"item\":\"book\"}";

fn request(principal: &str, key: &str, body: &str) -> Request {
    Request::new(principal, Some(key.into()), "POST", "/orders", Some(body.as_bytes().to_vec()))
}

fn expiry_values(response: &Response) -> Vec<String> {
    let named = response.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(EXPIRES_HEADER));
    named.map(|(_, v)| v.clone()).collect()
}

/// The stored row's expires_at as the header tells it.
async fn stored_expiry(pg: &tokio_postgres::Client, who: &str, key: &str) -> Vec<String> {
    let sql = "SELECT floor(extract(epoch FROM expires_at))::bigint \
               FROM idempotency.lookup($1, $2)";
    let epoch: i64 = pg.query_one(sql, &[&who, &key]).await.unwrap().get(0);
    vec![http_date(epoch)]
}

/// handle() with a handler that answers `status` and sets the header itself.
async fn answer(client: &Client, conn: &mut Connection, req: &Request, status: u16) -> Response {
    client
        .handle(conn, req, |_tx: &Transaction<'_>| {
            Box::pin(async move {
                let headers = vec![
                    ("Location".to_string(), "/orders/1".to_string()),
                    (EXPIRES_HEADER.to_string(), "the handler's own".to_string()),
                ];
                Ok(Response::new(status, headers, "{\"id\":1}"))
            })
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn expiry_is_the_stored_rows_on_every_answer_and_never_stored() {
    let pg = common::connect().await;
    let mut conn = Connection::new(common::connect().await);
    let mut kept = vec![EXPIRES_HEADER.to_string()];
    kept.extend(DEFAULT_KEPT_HEADERS.iter().map(|h| h.to_string()));
    let client = Client::new(Options { kept_headers: kept, ..Options::default() });
    let who = common::unique("expiry");
    let first = answer(&client, &mut conn, &request(&who, "k", ORDER), 201).await;
    assert_eq!(first.status, 201);
    assert_eq!(expiry_values(&first), stored_expiry(&pg, &who, "k").await, "first");
    let sql = "SELECT count(*) FROM idempotency.keys WHERE principal = $1 \
               AND response_headers::text ILIKE '%' || $2 || '%'";
    let stored: i64 = pg.query_one(sql, &[&who, &EXPIRES_HEADER]).await.unwrap().get(0);
    assert_eq!(stored, 0, "the expiry header is not stored");
    tokio::time::sleep(Duration::from_millis(1100)).await; // a new value would move
    let replay = answer(&client, &mut conn, &request(&who, "k", ORDER), 201).await;
    assert!(replay.replayed);
    assert_eq!(replay.header("Location"), Some("/orders/1"));
    assert_eq!(expiry_values(&replay), expiry_values(&first), "replay");
    let other = answer(&client, &mut conn, &request(&who, "k", "{}"), 201).await;
    assert_eq!(other.status, 422);
    assert_eq!(expiry_values(&other), expiry_values(&first), "422");
    // A final error is stored by save_final: the header is that row's expiry.
    let error = answer(&client, &mut conn, &request(&who, "k-409", ORDER), 409).await;
    assert_eq!(error.status, 409);
    assert_eq!(expiry_values(&error), stored_expiry(&pg, &who, "k-409").await, "stored 409");
    // A 500 stores nothing: the client adds nothing (the handler's own value stays).
    let failed = answer(&client, &mut conn, &request(&who, "k-500", ORDER), 500).await;
    assert_eq!(expiry_values(&failed), ["the handler's own"]);
    assert_eq!(common::state(&pg, &who, "k-500").await, None);
}

/// A transaction on its own connection that holds (who, key) until dropped.
async fn hold<'a>(pg: &'a mut tokio_postgres::Client, req: &Request) -> Transaction<'a> {
    let holder = pg.transaction().await.unwrap();
    assert!(matches!(Client::default().begin(&holder, req).await.unwrap(), Begun::Started));
    holder
}

#[tokio::test]
async fn reject_is_409_at_once_from_options_or_request() {
    let mut pg = common::connect().await;
    let wait = Some(Duration::from_secs(3));
    for per_request in [false, true] {
        let who = common::unique("reject");
        let mut req = request(&who, "k", ORDER);
        let holder = hold(&mut pg, &req).await;
        let mut options = Options { wait, ..Options::default() };
        if per_request {
            req.duplicates = Some(DuplicateMode::Reject);
        } else {
            options.duplicates = DuplicateMode::Reject;
        }
        let mut conn = Connection::new(common::connect().await);
        let started = Instant::now();
        let busy = answer(&Client::new(options), &mut conn, &req, 201).await;
        let took = started.elapsed();
        holder.rollback().await.unwrap();
        assert_eq!(busy.status, 409, "per request: {}", per_request);
        assert!(took < Duration::from_secs(1), "did not wait: {:?}", took);
        assert_eq!(busy.header("Retry-After"), Some("1"));
        assert!(expiry_values(&busy).is_empty(), "a transaction's hold has no row yet");
    }
}

#[tokio::test]
async fn wait_waits_for_the_holder_and_a_request_can_choose_it() {
    let mut pg = common::connect().await;
    let who = common::unique("wait");
    let mut req = request(&who, "k", ORDER);
    let holder = hold(&mut pg, &req).await;
    // The client rejects; this request asks to wait (up to 300 ms).
    let options = Options {
        wait: Some(Duration::from_millis(300)),
        duplicates: DuplicateMode::Reject,
        ..Options::default()
    };
    req.duplicates = Some(DuplicateMode::Wait);
    let mut conn = Connection::new(common::connect().await);
    let started = Instant::now();
    let busy = answer(&Client::new(options), &mut conn, &req, 201).await;
    let took = started.elapsed();
    holder.rollback().await.unwrap();
    assert_eq!(busy.status, 409);
    assert!(took >= Duration::from_millis(250), "waited: {:?}", took);
}
