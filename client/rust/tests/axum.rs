//! Feature `axum`: the tower layer over a lease runner (against the run's cluster), the
//! streamed body, header values.
#![cfg(feature = "axum")]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use pg_idempotency::axum_glue::{field_value, stream_response, LeaseLayer};
use pg_idempotency::{LeaseOptions, LeaseRunner, Policy, Response, StreamEvent};
use tokio::sync::mpsc;
use tower::ServiceExt;

fn app(runs: Arc<AtomicU32>) -> Router {
    let options = LeaseOptions { policy: Policy::Remember, ..LeaseOptions::default() };
    let runner = Arc::new(LeaseRunner::new(common::config(), options).unwrap());
    let layer = LeaseLayer::new(runner, |parts: &axum::http::request::Parts| {
        let auth = parts.headers.get("authorization")?.to_str().ok()?;
        auth.strip_prefix("Bearer ").map(str::to_string)
    });
    let charge = move || {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move { (StatusCode::CREATED, [("Location", format!("/charges/{}", n))], "charged") }
    };
    Router::new()
        .route("/charges", post(charge))
        .route("/health", get(|| async { "ok" }))
        .layer(layer)
}

fn charge(principal: &str, key: Option<&str>) -> HttpRequest<Body> {
    let mut request =
        HttpRequest::post("/charges").header("authorization", format!("Bearer {}", principal));
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.body(Body::from("{\"amount\":10}")).unwrap()
}

async fn body(response: axum::response::Response) -> Vec<u8> {
    axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap().to_vec()
}

#[tokio::test]
async fn the_layer_runs_a_route_once_and_replays_it() {
    let runs = Arc::new(AtomicU32::new(0));
    let app = app(runs.clone());
    let who = common::unique("axum");
    let first = app.clone().oneshot(charge(&who, Some("k1"))).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replay").is_none());
    assert!(first.headers().get("idempotency-expires").is_some());
    let again = app.clone().oneshot(charge(&who, Some("k1"))).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replay"], "true");
    assert_eq!(again.headers()["location"], "/charges/1");
    assert_eq!(body(again).await, b"charged");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the route ran once");
    let missing = app.clone().oneshot(charge(&who, None)).await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert!(String::from_utf8(body(missing).await).unwrap().contains("idempotency-key-missing"));
    let health = HttpRequest::get("/health").body(Body::empty()).unwrap();
    let health = app.clone().oneshot(health).await.unwrap();
    assert_eq!((health.status(), body(health).await), (StatusCode::OK, b"ok".to_vec()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_stream_is_sent_as_it_comes_and_a_broken_one_is_aborted() {
    let (events, answers) = mpsc::channel(8);
    let head = Response::new(200, vec![("Content-Type".into(), "text/plain".into())], "");
    events.send(StreamEvent::Head(head)).await.unwrap();
    events.send(StreamEvent::Chunk(b"ab".to_vec())).await.unwrap();
    events.send(StreamEvent::Chunk(b"c".to_vec())).await.unwrap();
    events.send(StreamEvent::End).await.unwrap();
    let response = stream_response(answers).await;
    assert_eq!(response.headers()["content-type"], "text/plain");
    assert_eq!(body(response).await, b"abc");
    let (events, answers) = mpsc::channel(8);
    events.send(StreamEvent::Head(Response::new(200, vec![], ""))).await.unwrap();
    events.send(StreamEvent::Chunk(b"ab".to_vec())).await.unwrap();
    drop(events); // no End: the stream broke
    let broken = stream_response(answers).await;
    assert!(axum::body::to_bytes(broken.into_body(), 1 << 20).await.is_err());
}

#[test]
fn every_stored_field_value_replays() {
    let value = field_value("a\tb c\u{80}\u{e9}\u{ff}").expect("a field value");
    assert_eq!(value.as_bytes(), b"a\tb c\x80\xe9\xff");
    assert!(field_value("20 \u{20ac}").is_none(), "above U+00FF is not one octet");
    assert!(field_value("a\nb").is_none(), "LF is refused by HeaderValue too");
}
